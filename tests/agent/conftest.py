"""edged updating itself (issue 32, docs/agent-updates.md "On the device"): the launcher, the
installer, the agent controller.

What is real: ``edged-launcher`` processes (``python -m edged.launcher``) over slots on disk,
kill -9 for power cuts, real tarballs for the installer, an abstract-namespace datagram socket
standing in for systemd's notify socket. What is fake: the slots' edged in the launcher tests is
a small script (tests/agent/launchertesting.py) that does what the test picks.
"""
