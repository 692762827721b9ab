SUMMARY = "securesystemslib: signing and key primitives used by python-tuf"
DESCRIPTION = "Cryptographic signing interfaces for TUF and in-toto (keys from python3-cryptography)."
HOMEPAGE = "https://github.com/secure-systems-lab/securesystemslib"
SECTION = "devel/python"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=e9703d169911cdb29305f88411c78717"

SRC_URI[sha256sum] = "b16e07c32bb41174c2ee2fb18f478ebe0d52e0e7c1fb085ce89c990452a35977"

inherit pypi python_hatchling

RDEPENDS:${PN} += "\
    python3-cryptography \
"
