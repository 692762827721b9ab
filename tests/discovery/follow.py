"""Run under a testbed: the discovery component alone; prints one line per accelerator change.

Lines on stdout: ``ready`` once started, then ``changed <kinds>`` each time the component
reports that the accelerators changed (after debouncing). Stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import tempfile
from pathlib import Path

from edged.discovery.discovering import Discovery


async def main() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    def changed() -> None:
        kinds = ",".join(sorted(a.kind for a in d.accelerators if a.usable)) or "-"
        print(f"changed {kinds}", flush=True)

    d = Discovery(
        data_dir=Path(tempfile.gettempdir()),
        python=sys.executable,
        health_period_s=3600,
        configured_providers=["CPUExecutionProvider"],
        on_accelerators_changed=changed,
    )
    await d.prepare()
    task = asyncio.ensure_future(d.run(stop))
    await asyncio.sleep(0.05)  # the monitor is on the loop
    print("ready", flush=True)
    await task


asyncio.run(main())
