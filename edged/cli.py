"""The ``edged`` command: run, status, doctor, --version."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

from edgefleet.versioning import version_text

DEFAULT_DATA_DIR = "/var/lib/edged"
DEFAULT_RUNTIME_DIR = Path("/run/edged")  # edged.service: RuntimeDirectory=edged
STATUS_SOCKET_NAME = "edged.sock"


def _version_text() -> str:
    lines = [version_text("edged")]
    try:
        import onnxruntime as ort

        lines.append(f"onnxruntime {ort.__version__} ({', '.join(ort.get_available_providers())})")
    except ImportError:
        lines.append("onnxruntime: not installed")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edged", description="edgefleet device daemon: runs models by declared intent"
    )
    p.add_argument("--version", action="store_true", help="print versions and exit")
    sub = p.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--data-dir", help=f"state directory (default {DEFAULT_DATA_DIR})")
    run.add_argument("--config", type=Path, help="edged.toml")
    run.add_argument("--manifests", type=Path, help="directory of static ModelDeployment files")
    run.add_argument("--log-level", help="debug|info|warning|error (overrides the config)")
    ck = sub.add_parser(
        "check",
        help="check, read-only, that this edged runs here: config, state, runtime (the smoke "
        "test of a new release, docs/agent-updates.md)",
    )
    ck.add_argument("--data-dir", help=f"state directory (default {DEFAULT_DATA_DIR})")
    ck.add_argument("--config", type=Path, help="edged.toml")
    st = sub.add_parser("status", help="what the running daemon says")
    st.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    st.add_argument("--socket", help="status socket path (default DATA_DIR/edged.sock)")
    st.add_argument("-o", "--output", choices=("table", "json"), default="table")
    doc = sub.add_parser(
        "doctor", help="what hardware, execution providers and health this device has"
    )
    doc.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    doc.add_argument("--manifests", type=Path, help="static manifests (DeviceHealthPolicy)")
    doc.add_argument("-o", "--output", choices=("table", "json"), default="table")
    en = sub.add_parser("enroll", help="join a hub with a bootstrap token")
    en.add_argument(
        "--hub", required=True, help="the hub's HOST:PORT (its replicas: HOST:PORT,HOST:PORT,...)"
    )
    en.add_argument(
        "--token",
        help="a bootstrap token (hub token create); default: $EDGED_TOKEN, which keeps it "
        "out of the process list",
    )
    en.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    en.add_argument(
        "--ca-hash", required=True, help="sha256:<hex>, the hub CA pin printed with the token"
    )
    en.add_argument(
        "--root-hash",
        help="sha256:<hex>, the fleet trust root's pin (edgectl trust root create prints it); "
        "needed when the image has no trust root (trust.rootFile)",
    )
    en.add_argument("--config", type=Path, help="edged.toml (for trust.rootFile and trust.tpm)")
    en.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE",
        help="a label of the device's own choosing, where its token allows (repeatable); a "
        "Secret never follows it: label through the token (hub token create --label) instead",
    )  # fmt: skip
    en.add_argument(
        "--name",
        default="",
        help="the device name, taken exactly (default: this machine's hostname, made a DNS "
        "label; the hub adds a suffix when a device holds it)",
    )
    en.add_argument("--enroll-address", help="HOST:PORT of enrollment (default: hub port + 1)")
    en.add_argument("--force", action="store_true", help="enroll again, replacing the link")
    tr = sub.add_parser("trust", help="the device's trust state")
    trsub = tr.add_subparsers(dest="trust_command", required=True, metavar="COMMAND")
    reset = trsub.add_parser(
        "reset",
        help="start the trust state again from the image's root (forgets the highest accepted "
        "versions), adopting the TPM counter; edged must be stopped",
    )
    reset.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    reset.add_argument("--config", type=Path, help="edged.toml (for trust.tpm)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.version:
        print(_version_text())
        return 0
    if args.command == "run":
        return _run(args)
    if args.command == "status":
        return _status(args)
    if args.command == "check":
        return _check(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "enroll":
        return _enroll(args)
    if args.command == "trust":
        return _trust_reset(args)
    _parser().print_help()
    return 2


def _check(args: argparse.Namespace) -> int:
    """``edged check``: 0 when this edged can run with this config and state, 1 otherwise;
    one JSON line either way (edged.agent.checking)."""
    from edged.agent.checking import check

    result = check(args.config, Path(args.data_dir) if args.data_dir else None)
    sys.stdout.write(orjson.dumps(result.to_json()).decode() + "\n")
    return 0 if result.ok else 1


def _trust_reset(args: argparse.Namespace) -> int:
    """``edged trust reset``: the deliberate recovery from ``TrustStateLost``: remove
    ``D/trust/`` and write a state that adopts the TPM counter's value (docs/trust.md)."""
    import fcntl
    import shutil

    from edged.config import ServiceDirs, load_config
    from edged.trust.identity import resolve_tcti
    from edged.trust.tpmcounter import TpmCounter
    from edgefleet.errors import ConfigError, EdgefleetError
    from edgefleet.persisting import write_json_atomic
    from edgefleet.trust.verifying import TrustState

    data_dir = Path(args.data_dir)
    try:
        config = load_config(
            args.config, data_dir=data_dir, service=ServiceDirs.from_environ(os.environ)
        )
    except (ConfigError, OSError) as exc:
        print(f"edged: invalid config: {exc}", file=sys.stderr)
        return 2
    lock = data_dir / "edged.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        print(f"edged: trust reset: {lock}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print("edged: trust reset: edged is running on this data directory: stop it first",
                  file=sys.stderr)  # fmt: skip
            return 1
        tcti = resolve_tcti(config.trust.tpm)
        try:
            value = TpmCounter(tcti).read() if tcti is not None else None
        except EdgefleetError as exc:
            print(f"edged: trust reset: {exc}", file=sys.stderr)
            return 1
        shutil.rmtree(data_dir / "trust", ignore_errors=True)
        if value:
            write_json_atomic(
                data_dir / "trust" / "state.json", TrustState(tpm_counter=value).to_json()
            )
        print(
            f"trust state reset in {data_dir / 'trust'}"
            + (f" (TPM counter {value} adopted)" if value else "")
            + "; edged starts again from the image's root (trust.rootFile)"
        )
        return 0
    finally:
        os.close(fd)


def _enroll(args: argparse.Namespace) -> int:
    import asyncio

    from edged.hublink.enrolling import enroll
    from edgefleet.api.meta import label_key, label_value
    from edgefleet.errors import EdgefleetError
    from edgefleet.logs import configure_logging

    configure_logging("warning")
    labels: dict[str, str] = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError("must be KEY=VALUE")
            labels[label_key(key)] = label_value(value)
        except ValueError as exc:
            print(f"edged: --label {item!r}: {exc}", file=sys.stderr)
            return 2
    token = args.token or os.environ.get("EDGED_TOKEN", "")
    if not token:
        print("edged: enroll: give --token or set EDGED_TOKEN", file=sys.stderr)
        return 2
    data_dir = Path(args.data_dir)
    from edged.config import ServiceDirs, load_config
    from edgefleet.errors import ConfigError

    try:
        config = load_config(
            args.config, data_dir=data_dir, service=ServiceDirs.from_environ(os.environ)
        )
    except (ConfigError, OSError) as exc:
        print(f"edged: invalid config: {exc}", file=sys.stderr)
        return 2
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        result = asyncio.run(
            enroll(
                data_dir,
                hub=args.hub,
                token=token,
                labels=labels,
                name=args.name,
                ca_hash=args.ca_hash,
                root_file=config.trust.root_file,
                root_hash=args.root_hash,
                tpm=config.trust.tpm,
                enroll_address=args.enroll_address,
                force=args.force,
            )
        )
    except (EdgefleetError, ValueError) as exc:
        print(f"edged: enroll: {exc}", file=sys.stderr)
        return 1
    attestation = (
        "TPM-attested (attestation key bound to the endorsement key)"
        if result.attestation == "tpm"
        else "software-attested (no TPM attestation key bound)"
    )
    print(f"enrolled as {result.device_name}, {attestation}")
    if not args.name:
        import socket

        from edgefleet.devicenames import name_from_hostname

        wanted = name_from_hostname(socket.gethostname())
        if wanted is not None and result.device_name != wanted:
            print(f"({wanted}, from this hostname, is held by another device: the hub added a "
                  "suffix; give --name to choose)")  # fmt: skip
    print(f"start edged with: {run_hint(data_dir, args.config)}")
    return 0


def run_hint(data_dir: Path, config: Path | None) -> str:
    """The ``edged run`` command that starts this enrolled device: with the data directory and
    the config it was enrolled with (the config's trust settings are the ones it was enrolled
    under), quoted for a shell."""
    import shlex

    words = ["edged", "run", "--data-dir", str(data_dir)]
    if config is not None:
        words += ["--config", str(config)]
    return shlex.join(words)


def _run(args: argparse.Namespace) -> int:
    from edged.config import ServiceDirs, load_config
    from edgefleet.errors import ConfigError
    from edgefleet.logs import configure_logging

    data_dir = Path(args.data_dir) if args.data_dir else None
    try:
        config = load_config(
            args.config, data_dir=data_dir, service=ServiceDirs.from_environ(os.environ)
        )
    except ConfigError as exc:
        print(f"edged: invalid config: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level or config.log_level)
    if args.manifests is not None and not args.manifests.is_dir():
        print(f"edged: --manifests {args.manifests} is not a directory", file=sys.stderr)
        return 2
    from edged.daemon import Daemon
    from edged.state.locking import AlreadyRunning

    config_path = Path(args.config).resolve() if args.config else None

    async def _main() -> int:
        try:
            daemon = Daemon(
                config,
                manifests=args.manifests.resolve() if args.manifests else None,
                config_path=config_path,
            )
        except AlreadyRunning as exc:
            print(f"edged: {exc}", file=sys.stderr)
            return 1
        return await daemon.run()

    try:
        import uvloop

        return int(uvloop.run(_main()))
    except ImportError:  # pragma: no cover - non-Linux
        import asyncio

        return asyncio.run(_main())


def _doctor(args: argparse.Namespace) -> int:
    """Exit 0 when nothing is missing, 1 otherwise (so image builds can check it)."""
    from edged.discovery.doctor import gather, render_report

    if args.manifests is not None and not args.manifests.is_dir():
        print(f"edged: --manifests {args.manifests} is not a directory", file=sys.stderr)
        return 2
    report = gather(Path(args.data_dir), args.manifests)
    if args.output == "json":
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render_report(report))
    return 1 if report["missing"] else 0


def _status(args: argparse.Namespace) -> int:
    # here, not at the top: http.client (and email, which it imports) is for this client only
    from edgefleet.devicestatus import fetch_status, render_status

    sock = args.socket or str(Path(args.data_dir) / STATUS_SOCKET_NAME)
    service_sock = DEFAULT_RUNTIME_DIR / STATUS_SOCKET_NAME  # edged.service puts it there
    if args.socket is None and not Path(sock).exists() and service_sock.exists():
        sock = str(service_sock)
    try:
        doc = fetch_status(sock)
    except OSError as exc:
        print(f"edged: cannot reach the status socket {sock}: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(render_status(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
