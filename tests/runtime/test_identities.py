"""Which uid a worker replica gets: the pure allocator as tables, then :class:`WorkerUids` with
real locks (flock) in a temporary lock directory. No root needed."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from edged.runtime.identities import (
    NoUidFree,
    UidRange,
    WorkerUids,
    accelerator_groups,
    choose_uid,
    slot_key,
    uid_candidates,
)

SMALL = UidRange(70000, 8)


def test_a_slot_tries_every_uid_of_the_range_once_starting_from_its_own() -> None:
    order = list(uid_candidates(slot_key("mlp", 0), SMALL))
    assert sorted(order) == list(range(70000, 70008))
    assert order == list(uid_candidates(slot_key("mlp", 0), SMALL))  # deterministic
    start = order[0] - SMALL.base
    assert order == [SMALL.base + (start + i) % 8 for i in range(8)]  # then the next ones


def test_slots_prefer_different_uids() -> None:
    big = UidRange()
    firsts = {next(uid_candidates(slot_key("mlp", slot), big)) for slot in range(16)}
    assert len(firsts) >= 15  # a hash: a collision is possible, not likely


def test_nobody_and_the_16_bit_minus_one_are_never_given() -> None:
    assert set(uid_candidates("x", UidRange(65530, 10))) == set(range(65530, 65540)) - {
        65534,
        65535,
    }


@pytest.mark.parametrize(
    ("taken", "expected"),
    [((), 0), ((0,), 1), ((0, 1), 2), ((1,), 0), ((0, 2), 1), (tuple(range(8)), None)],
)
def test_choose_uid_skips_what_is_unavailable(taken: tuple[int, ...], expected: int | None) -> None:
    """``taken`` and ``expected``: positions in the slot's own order of the range."""
    order = list(uid_candidates("w/0", SMALL))
    want = None if expected is None else order[expected]
    assert choose_uid("w/0", SMALL, {order[i] for i in taken}) == want


def test_live_replicas_never_share_a_uid_and_a_stopped_one_frees_it(tmp_path: Path) -> None:
    uids = WorkerUids(SMALL, lock_dir=tmp_path)
    got = [uids.acquire(f"w-{i}", slot_key("w", 0)) for i in range(3)]  # same slot key
    assert len(set(got)) == 3
    assert uids.acquire("w-1", slot_key("w", 0)) == got[1]  # held: the same again
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(map(str, got))
    uids.release("w-0")
    assert not (tmp_path / str(got[0])).exists()
    assert uids.acquire("w-9", slot_key("w", 0)) == got[0]  # free again, and preferred
    uids.release_all()
    assert list(tmp_path.iterdir()) == []


def test_a_uid_locked_by_systemd_or_another_edged_is_skipped(tmp_path: Path) -> None:
    first = next(uid_candidates(slot_key("w", 0), SMALL))
    fd = os.open(tmp_path / str(first), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as systemd holds a dynamic user's uid
    try:
        uids = WorkerUids(SMALL, lock_dir=tmp_path)
        assert uids.acquire("w-0", slot_key("w", 0)) != first
    finally:
        os.close(fd)
    # its holder gone (the lock with its descriptor): the file left behind does not block it
    again = WorkerUids(SMALL, lock_dir=tmp_path)
    assert again.acquire("w-1", slot_key("w", 0)) == first


def test_uids_of_users_groups_or_running_processes_are_never_given(tmp_path: Path) -> None:
    # 0 runs processes (at least this one's parents are somebody's; init is root) and 1 is a
    # user of every passwd file (daemon/bin)
    uids = WorkerUids(UidRange(0, 2), lock_dir=tmp_path)
    with pytest.raises(NoUidFree, match="no uid of 0-1 is free"):
        uids.acquire("w-0", "w/0")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes needs root")
def test_only_the_groups_of_accelerator_nodes_that_need_one(tmp_path: Path) -> None:
    import stat

    nodes = tmp_path / "dri"
    nodes.mkdir()
    for name, mode, gid in [
        ("renderD128", 0o660, 44),  # video: through its group
        ("card0", 0o666, 45),  # open to all: no group needed
        ("root-only", 0o660, 0),  # root's group: never given
        ("owner-only", 0o600, 46),
    ]:
        os.mknod(nodes / name, stat.S_IFCHR | mode, os.makedev(1, 3))
        os.chown(nodes / name, 0, gid)
        os.chmod(nodes / name, mode)
    (tmp_path / "plain").write_text("not a device")
    os.chown(tmp_path / "plain", 0, 47)
    found = accelerator_groups([str(nodes), str(tmp_path / "plain"), "/dev/absent"])
    assert found == (44,)


def test_a_lock_directory_that_cannot_be_made_is_said(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    locks = tmp_path / "file" / "locks"
    with pytest.raises(NoUidFree, match=f"cannot make {locks}: Not a directory"):
        WorkerUids(SMALL, lock_dir=locks).acquire("w-0", "w/0")


def test_a_runtime_other_users_cannot_read_is_named() -> None:
    import shutil
    import tempfile

    from edged.runtime.identities import runtime_blocker, unreadable_to_others

    tmp_path = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own temp root is 0700
    try:
        check_runtime_paths(tmp_path, unreadable_to_others)
    finally:
        shutil.rmtree(tmp_path)
    assert runtime_blocker() == ""  # this machine's onnxruntime: readable (the tests need it)


def check_runtime_paths(tmp_path: Path, unreadable_to_others) -> None:
    package = tmp_path / "site" / "onnxruntime"
    package.mkdir(parents=True)
    tmp_path.chmod(0o755)
    assert unreadable_to_others(str(package)) == ""
    (tmp_path / "site").chmod(0o700)  # like a Python under /root
    why = unreadable_to_others(str(package))
    assert why == f"{tmp_path / 'site'} is drwx------: other users cannot pass it"
    (tmp_path / "site").chmod(0o755)
    package.chmod(0o711)
    assert "other users cannot read it" in unreadable_to_others(str(package))
    package.chmod(0o755)
