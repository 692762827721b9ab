"""Drift: the pure checks are tables with made-up observations (no files, no processes); the
watch itself runs against real files, a real config and a real cgroup in tests/e2e."""
