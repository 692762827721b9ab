SUMMARY = "python-tuf: the reference implementation of The Update Framework"
DESCRIPTION = "TUF metadata and client (ngclient); edged updates its artifact metadata with it."
HOMEPAGE = "https://github.com/theupdateframework/python-tuf"
SECTION = "devel/python"
LICENSE = "Apache-2.0 | MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=8cc789b082b3d97e1ccc5261f8594d3f \
                    file://LICENSE-MIT;md5=0905c600830081fce64622608c4a2628"

SRC_URI[sha256sum] = "5ada1db78da3518fa851e28588f4b2249b8662a28ae528f54afa2a1de541fb31"

inherit pypi python_hatchling

RDEPENDS:${PN} += "\
    python3-securesystemslib \
    python3-urllib3 \
"
