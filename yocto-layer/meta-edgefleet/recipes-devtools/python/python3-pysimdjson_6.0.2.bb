SUMMARY = "pysimdjson: Python bindings for simdjson, a SIMD-accelerated JSON parser"
DESCRIPTION = "edged's inference workers parse JSON tensors with it straight into numpy \
(edged/runtime/tensors.py); without it they decode the same requests with orjson alone, slower."
HOMEPAGE = "https://github.com/TkTech/pysimdjson"
SECTION = "devel/python"
# pysimdjson is MIT; the simdjson sources it bundles are Apache-2.0, with parts under the
# Boost Software License (simdjson/simdjson.h says where)
LICENSE = "MIT & Apache-2.0 & BSL-1.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=798945fb1179e41262fde73e79e0588c \
                    file://simdjson/simdjson.h;beginline=545;endline=546;md5=664225ef14189f0254a1c65be9dc9f43"

SRC_URI[sha256sum] = "ddbd6fecd42aa01c5c87d3c79b8ede1885b6763337d21745587a5392572c1f45"

# 6.0.2: a setup.py build with the C++ already generated from Cython in the sdist, so it needs
# neither Cython nor the setuptools >= 74.1 that 7.x asks for (scarthgap has 69)
inherit pypi setuptools3

RDEPENDS:${PN} += "python3-core"
