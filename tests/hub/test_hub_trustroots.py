"""The hub's root chain on disk (hub/state/trustroots.py): real keys, real signed roots, real files.
A rotation is adopted and remembered across restarts; a root the hub cannot verify is refused
while running and stops the hub at its next start."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edgefleet.errors import HubDirError, TrustError
from edgefleet.trust.signing import (
    create_root,
    generate_key_pair,
    rotate_root,
    sign_root,
    write_envelope,
)
from hub.state.trustroots import ROOT_FILE, adopt_root, load_roots


def test_rotation_is_adopted_kept_and_checked_at_start(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    hub.mkdir()
    for name in ("root1", "root2", "pub", "hubkey"):
        generate_key_pair(tmp_path / name)
    v1 = create_root(
        root_keys=[tmp_path / "root1.key"],
        artifact_keys=[tmp_path / "pub.pub"],
        out=hub / ROOT_FILE,
    )
    roots = load_roots(hub)
    assert roots.chain == (v1.to_bytes(),)
    assert adopt_root(hub, roots, (hub / ROOT_FILE).read_bytes(), now=time.time()) is None

    v2 = sign_root(
        rotate_root(
            hub / ROOT_FILE,
            root_keys=[tmp_path / "root2.key"],
            artifact_keys=[tmp_path / "pub.pub"],
        ),
        [tmp_path / "root1.key"],
    )
    unsigned_v2 = rotate_root(
        hub / ROOT_FILE,
        root_keys=[tmp_path / "hubkey.key"],
        artifact_keys=[tmp_path / "hubkey.pub"],
    )
    with pytest.raises(TrustError) as info:  # not signed by the old root key
        adopt_root(hub, roots, unsigned_v2.to_bytes(), now=time.time())
    assert info.value.reason == "UnknownKey"
    assert not (hub / "trust-roots").exists()

    new = adopt_root(hub, roots, v2.to_bytes(), now=time.time())
    assert new is not None and new.chain == (v1.to_bytes(), v2.to_bytes())
    assert (hub / "trust-roots" / "1.json").read_bytes() == v1.to_bytes()
    write_envelope(v2, hub / ROOT_FILE)
    assert load_roots(hub).chain == (v1.to_bytes(), (hub / ROOT_FILE).read_bytes())
    assert load_roots(hub).enrollment_bytes().startswith(b"[")  # the chain, for enrollment

    write_envelope(unsigned_v2, hub / ROOT_FILE)  # replaced while the hub was stopped
    with pytest.raises(HubDirError) as err:
        load_roots(hub)
    assert "root version 2" in str(err.value)
