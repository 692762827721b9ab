"""One edged per data directory, with a real flock on a real file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edged.state.locking import AlreadyRunning, lock_data_dir


def test_a_second_edged_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    fd = lock_data_dir(tmp_path)
    try:
        with pytest.raises(AlreadyRunning, match=f"another edged is running on {tmp_path}"):
            lock_data_dir(tmp_path)
    finally:
        os.close(fd)
    again = lock_data_dir(tmp_path)  # released with its holder
    try:
        assert not os.get_inheritable(again)  # workers do not inherit it
    finally:
        os.close(again)
