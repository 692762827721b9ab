"""Discovery tests.

Real: pyudev and libudev reading a **umockdev** testbed (mocked sysfs, /dev and uevents, from
the record files in ``devices/``), psutil, the parsers. Pure functions (classification,
provider mapping and selection, health policy) are tested as tables with hand-made records.
umockdev is required (Debian packages ``umockdev`` and ``gir1.2-umockdev-1.0``, installed by
``scripts/install-system-deps``): without it these tests fail, they do not skip.
"""

from __future__ import annotations

import pytest
from umockdevs import check_umockdev


@pytest.fixture(scope="session")
def umockdev() -> None:
    problem = check_umockdev()
    if problem:
        pytest.fail(
            f"umockdev is required for the discovery tests ({problem}); install it with "
            "scripts/install-system-deps (Debian: umockdev gir1.2-umockdev-1.0 python3-gi)",
            pytrace=False,
        )
