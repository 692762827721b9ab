SUMMARY = "edgefleet on a device: edged as a systemd service with its Python package"
DESCRIPTION = "Add this to IMAGE_INSTALL for edged, enabled at boot, and its Python package."
SECTION = "base"
LICENSE = "Apache-2.0"

inherit packagegroup

RDEPENDS:${PN} = "\
    edged \
    python3-edgefleet \
"
