"""Trust tests: real Ed25519 keys, real files, a real ArtifactStore; the clock is fixed (NOW).

The helpers and fixtures live in ``tests/trusttesting.py`` (a uniquely named module: several
test folders have a ``conftest.py``, so ``from conftest import`` would be ambiguous).
"""

from trusttesting import device, keys, model_bytes  # noqa: F401 - fixtures
