"""The A/B launcher systemd starts (docs/agent-updates.md, "On the device"): stdlib only.

``edged-launcher [--launcher-OPTION ...] ARGS...`` runs ``python -P -m edged ARGS...`` from one
of three places: the base install (``package``) or an installed release in ``D/agent/slots/a``
or ``D/agent/slots/b`` (``PYTHONPATH=<slot>/lib``). ``D`` is edged's ``--data-dir`` (else
``$STATE_DIRECTORY``, else /var/lib/edged).

* ``D/agent/launcher.json`` (:data:`STATE_FORMAT`) is this launcher's state and it alone
  writes it (temp file, fsync, rename, fsync of the directory): the committed slot, the slot on
  trial with its try counter, and the last outcome (Committed or RolledBack, with a reason).
* ``D/agent/request.json`` is edged's request (``{"action": "try", "slot": "b", ...}`` or
  ``{"action": "abort", "reason": ...}``), consumed when edged exits or the launcher starts.
* Boot counting, as systemd-boot does it: each start of the slot on trial increments its tries
  (persisted) before the exec; the trial fails when edged has been started ``maxTries`` times
  without a commit (CrashLoop) or one start does not commit within ``commitDeadlineSeconds``
  (CommitDeadlineExceeded). Then the committed slot runs again. Commit: edged sends
  ``EDGED_COMMIT=1`` on the launcher's notify socket.
* sd_notify both ways: edged's ``NOTIFY_SOCKET`` is the launcher's; ``READY=1``, ``STATUS=``,
  ``STOPPING=1`` go on to systemd; ``WATCHDOG=1`` feeds the launcher's own watchdog on edged
  (a stuck edged is killed here, since the unit's ``KillMode=process`` lets systemd signal the
  launcher only) and the launcher pings systemd while edged is healthy; ``FDSTORE=1``
  descriptors are kept (and passed on to systemd's store) and handed to the next edged as
  ``LISTEN_FDS``/``LISTEN_FDNAMES``.
* SIGTERM, SIGINT and SIGHUP go to edged; the launcher exits when edged exits for good (not a
  switch, not a trial restart) with edged's status, and systemd restarts it.

A power cut at any instant leaves a bootable device: each step is one atomic write; an
unreadable state falls back to the package; a slot without its ``installed.json`` (written
last by edged.agent.installing, inside the temporary tree renamed into place) is never run.

The parts: :mod:`.state` (launcher.json, the slots, atomic writes), :mod:`.supervising` (the
:class:`~edged.launcher.supervising.Launcher` loop: trials, sd_notify, signals),
:mod:`.cleanup` (``edged-launcher cleanup``, the unit's ExecStopPost=) and :mod:`.cli` (the
command line). Each imports the standard library and its siblings only.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """``edged-launcher`` (the console script, ``python -m edged.launcher``): :func:`.cli.main`."""
    from edged.launcher.cli import main as run

    return run(argv)
