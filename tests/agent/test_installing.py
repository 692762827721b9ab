"""Installing a release into the inactive slot: a valid one lands whole (its installed.json
last), and every attack or mismatch is refused with its reason, leaving the slot as it was."""

from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

import pytest
from tarballtesting import DEVICE, add_file, build_release, have, release_json

from edged.agent.installing import InstallRefused, Platform, install_release
from edged.launcher.state import slot_version

BASE = have({"grpcio": "1.0"})


def install(tmp_path: Path, release_path: Path | None = None, **kw: object) -> object:
    release = build_release(release_path or tmp_path / "r.tar.gz", **kw)  # type: ignore[arg-type]
    return install_release(release, tmp_path / "d", "b", device=DEVICE, installed=BASE)


def test_a_valid_release_is_installed_whole_and_runnable(tmp_path: Path) -> None:
    slot = install_release(
        build_release(tmp_path / "r.tar.gz", "0.2.1"), tmp_path / "d", "b",
        device=DEVICE, installed=BASE,
    )  # fmt: skip
    assert slot.version == "0.2.1" and slot.root == tmp_path / "d" / "agent" / "slots" / "b"
    assert (slot.root / "lib" / "edged" / "__main__.py").read_bytes() == b"print('edged')\n"
    assert json.loads((slot.root / "installed.json").read_text())["files"] == 3
    assert slot_version(tmp_path / "d", "b") == "0.2.1"  # what the launcher will accept
    assert [p.name for p in (tmp_path / "d" / "agent" / "slots").iterdir()] == ["b"]


def test_a_newer_release_replaces_the_inactive_slot(tmp_path: Path) -> None:
    data = tmp_path / "d"
    install_release(build_release(tmp_path / "1.tgz", "0.2.1"), data, "b",
                    device=DEVICE, installed=BASE)  # fmt: skip
    install_release(build_release(tmp_path / "2.tgz", "0.2.2"), data, "b",
                    device=DEVICE, installed=BASE)  # fmt: skip
    assert slot_version(data, "b") == "0.2.2"
    assert sorted(p.name for p in (data / "agent" / "slots").iterdir()) == ["b"]


def test_a_cut_install_leaves_no_slot_and_is_cleaned_next_time(tmp_path: Path) -> None:
    data = tmp_path / "d"
    half = data / "agent" / "slots" / ".install-b-999"
    (half / "lib" / "edged").mkdir(parents=True)
    (half / "release.json").write_text(json.dumps(release_json("0.2.1")))
    assert slot_version(data, "b") is None
    install_release(build_release(tmp_path / "r.tgz"), data, "b", device=DEVICE, installed=BASE)
    assert not half.exists()


def _symlink(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("lib/edged/evil")
    info.type = tarfile.SYMTYPE
    info.linkname = "/etc/shadow"
    tar.addfile(info)


def _hardlink(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("lib/edged/evil")
    info.type = tarfile.LNKTYPE
    info.linkname = "../../etc/passwd"
    tar.addfile(info)


def _device(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("lib/edged/mem")
    info.type = tarfile.CHRTYPE
    info.devmajor, info.devminor = 1, 1
    tar.addfile(info)


def _fifo(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("lib/edged/fifo")
    info.type = tarfile.FIFOTYPE
    tar.addfile(info)


@pytest.mark.parametrize(
    ("extra", "reason", "says"),
    [
        (lambda t: add_file(t, "../escape.py", b"x"), "UnsafeRelease", "inside the release"),
        (lambda t: add_file(t, "lib/../../escape", b"x"), "UnsafeRelease", "inside the release"),
        (lambda t: add_file(t, "/etc/cron.d/x", b"x"), "UnsafeRelease", "inside the release"),
        (lambda t: add_file(t, "bin/sh", b"x"), "UnsafeRelease", "only release.json and lib/"),
        (lambda t: add_file(t, "lib/x", b"x", 0o4755), "UnsafeRelease", "setuid"),
        (_symlink, "UnsafeRelease", "links, devices and FIFOs"),
        (_hardlink, "UnsafeRelease", "links, devices and FIFOs"),
        (_device, "UnsafeRelease", "links, devices and FIFOs"),
        (_fifo, "UnsafeRelease", "links, devices and FIFOs"),
    ],
    ids=[
        "dotdot",
        "dotdot-inside",
        "absolute",
        "outside-lib",
        "setuid",
        "symlink",
        "hardlink",
        "device",
        "fifo",
    ],
)
def test_attacks_in_the_tarball_are_refused(
    tmp_path: Path, extra: object, reason: str, says: str
) -> None:
    with pytest.raises(InstallRefused) as err:
        install(tmp_path, extra=extra)
    assert err.value.reason == reason and says in err.value.message
    assert not (tmp_path / "escape.py").exists()
    assert [p.name for p in (tmp_path / "d" / "agent" / "slots").iterdir()] == []


def test_a_decompression_bomb_stops_at_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "bomb.tgz"
    release = build_release(path, extra=lambda t: add_file(t, "lib/zeros", b"\0" * (8 << 20)))
    assert path.stat().st_size < 100_000
    with pytest.raises(InstallRefused) as err:
        install_release(release, tmp_path / "d", "b", device=DEVICE, installed=BASE,
                        limits=(100, 1 << 20, 4 << 20))  # fmt: skip
    assert err.value.reason == "ReleaseTooLarge"
    with pytest.raises(InstallRefused) as err:
        install_release(release, tmp_path / "d", "b", device=DEVICE, installed=BASE,
                        limits=(100, 16 << 20, 4 << 20))  # fmt: skip
    assert err.value.reason == "ReleaseTooLarge" and "unpacks to more" in err.value.message


def test_too_many_entries_are_refused(tmp_path: Path) -> None:
    def many(tar: tarfile.TarFile) -> None:
        for i in range(50):
            add_file(tar, f"lib/m{i}.py", b"")

    release = build_release(tmp_path / "r.tgz", extra=many)
    with pytest.raises(InstallRefused) as err:
        install_release(release, tmp_path / "d", "b", device=DEVICE, installed=BASE,
                        limits=(20, 1 << 20, 1 << 20))  # fmt: skip
    assert err.value.reason == "ReleaseTooLarge"


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        (release_json("0.2.1", platform={"arch": "aarch64", "pythonAbi": "cp311"}),
         "InvalidRelease"),  # release.json says another platform than was signed
        (release_json("0.2.9"), "InvalidRelease"),  # another version than was signed
        (release_json("0.2.1", requires={"grpcio": "9.9"}), "RequirementsNotMet"),
        (release_json("0.2.1", requires={"torch": "2.0"}), "RequirementsNotMet"),
        (release_json("0.2.1", format=2), "InvalidRelease"),
    ],
)  # fmt: skip
def test_a_release_this_device_cannot_run_is_refused_before_the_switch(
    tmp_path: Path, doc: dict[str, object], reason: str
) -> None:
    with pytest.raises(InstallRefused) as err:
        install(tmp_path, doc=doc)
    assert err.value.reason == reason
    assert slot_version(tmp_path / "d", "b") is None


def test_a_release_for_another_platform_is_refused(tmp_path: Path) -> None:
    release = build_release(tmp_path / "r.tgz")
    for device in (Platform("aarch64", "cp311"), Platform("x86_64", "cp312")):
        with pytest.raises(InstallRefused) as err:
            install_release(release, tmp_path / "d", "b", device=device, installed=BASE)
        assert err.value.reason == "PlatformMismatch"


def test_not_a_tarball_and_no_edged_inside(tmp_path: Path) -> None:
    release = build_release(tmp_path / "r.tgz")
    release.path.write_bytes(b"not gzip at all")
    with pytest.raises(InstallRefused) as err:
        install_release(release, tmp_path / "d", "b", device=DEVICE, installed=BASE)
    assert err.value.reason == "InvalidRelease"
    with tarfile.open(tmp_path / "e.tgz", "w:gz") as tar:
        add_file(tar, "release.json", json.dumps(release_json("0.2.1")).encode())
    with pytest.raises(InstallRefused) as err:
        install_release(dataclasses.replace(release, path=tmp_path / "e.tgz"), tmp_path / "d",
                        "b", device=DEVICE, installed=BASE)  # fmt: skip
    assert "__main__" in err.value.message
