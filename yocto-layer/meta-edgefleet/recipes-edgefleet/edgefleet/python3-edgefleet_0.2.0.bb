SUMMARY = "edgefleet: run ONNX models on fleets of edge devices (Python package)"
DESCRIPTION = "The edgefleet Python distribution: edged (device daemon), hub and edgectl."
HOMEPAGE = "https://github.com/edgefleet/edgefleet"
SECTION = "devel/python"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"

SRC_URI = "git://github.com/edgefleet/edgefleet.git;protocol=https;branch=main"
SRCREV = "${AUTOREV}"

S = "${UNPACKDIR}/git"

inherit python_setuptools_build_meta

# pyproject.toml names its license as an SPDX string (PEP 639), which setuptools reads from 77
# on; scarthgap to walnascar ship 69 to 76, which take only the older table form
do_configure:prepend() {
    sed -i 's/^license = "Apache-2.0"$/license = { text = "Apache-2.0" }/' ${S}/pyproject.toml
}

# Keep in step with pyproject.toml [project] dependencies (tests/packaging/test_yocto.py).
# onnxruntime comes from a layer that provides it (see README.md).
RDEPENDS:${PN} += "\
    python3-asyncio \
    python3-core \
    python3-cryptography \
    python3-grpcio \
    python3-httptools \
    python3-numpy \
    python3-onnxruntime \
    python3-orjson \
    python3-protobuf \
    python3-psutil \
    python3-pyudev \
    python3-pyyaml \
    python3-tuf \
    python3-uvloop \
"

# pyproject's `fast` extra (the Debian packages install it too): JSON tensors parsed straight
# into numpy; an image may leave it out (BAD_RECOMMENDATIONS), workers then use orjson alone
RRECOMMENDS:${PN} = "python3-pysimdjson"
