"""The device's sockets from the outside: HTTP over a Unix socket (the status socket and the
inference socket), and the status document rendered for a person (``edged status``, the
quickstart, tests)."""

from __future__ import annotations

import http.client
import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket (for ``edged status`` and tests)."""

    def __init__(self, path: str | os.PathLike[str], timeout: float = 5.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = os.fspath(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def send_request(
    sock_path: str | os.PathLike[str],
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes, dict[str, str]]:
    """One HTTP request over a Unix socket: the status, the body and the headers (names in lower
    case). OSError when the socket cannot be reached."""
    conn = UnixHTTPConnection(sock_path, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def fetch_status(sock_path: str | os.PathLike[str]) -> dict[str, Any]:
    """``GET /v1/status`` on the status socket, decoded."""
    doc: dict[str, Any] = orjson.loads(send_request(sock_path, "GET", "/v1/status", timeout=5.0)[1])
    return doc


def _sandbox_summary(replicas: list[dict[str, Any]]) -> str:
    """What confines a workload's replicas: ``landlock(fs,net,scoped)+nnp+seccomp+uid``,
    ``off`` (``off+uid``), ``mixed`` when they differ, ``-`` before any reported it
    (``+uid``: each runs as a uid of its own)."""
    seen = set()
    for r in replicas:
        sb = r.get("sandbox") or {}
        if not sb.get("inForce"):
            continue
        uid = "+uid" if sb.get("separateUid") else ""
        if sb.get("mode") == "off":
            seen.add("off" + uid + ("!" if sb.get("problems") else ""))
            continue
        short = {"filesystem": "fs", "network": "net", "scoped": "scoped"}
        text = f"landlock({','.join(v for k, v in short.items() if sb.get(k))})"
        text += "+nnp" if sb.get("noNewPrivs") else ""
        text += "+seccomp" if sb.get("seccomp") else ""
        text += uid
        seen.add(text + ("!" if sb.get("problems") else ""))
    if not seen:
        return "-"
    return seen.pop() if len(seen) == 1 else "mixed"


def render_status(doc: dict[str, Any]) -> str:
    dev = doc.get("device", {})
    out = [
        f"device {dev.get('name')}  edged {dev.get('edgedVersion')}  pid {dev.get('pid')}  "
        f"up {dev.get('uptimeSeconds', 0):.0f}s  generation {doc.get('generation')}  "
        f"ready {'yes' if doc.get('ready') else 'no'}  limits {dev.get('limitsMode')}",
    ]
    if dev.get("limitsProblem"):  # workers on rlimits (edged/runtime/delegating.py)
        out.append(f"limits not enforced by cgroup v2: {dev['limitsProblem']}")
    health = dev.get("health")
    if health is not None:  # discovery is on
        accs = ", ".join(
            f"{a['vendor']}-{a['class']} {a['id']}" + ("" if a["usable"] else " (not usable)")
            for a in dev.get("accelerators", [])
        )
        out.append(
            f"schedulable {'yes' if health.get('schedulable') else 'no'}  "
            f"accelerators {accs or 'none'}"
        )
        out += [f"  unschedulable: {r}" for r in health.get("reasons", [])]
    trust = dev.get("trust", {})
    if trust.get("allowUnsigned"):
        out.append("WARNING: trust.allowUnsigned is on: unsigned artifacts are accepted")
        if trust.get("unsignedArtifacts"):
            out.append(
                "WARNING: unsigned artifacts in use: " + ", ".join(trust["unsignedArtifacts"])
            )
    if trust.get("rootVersion") is not None:
        version, expires = trust["rootVersion"], trust.get("rootExpires")
        out.append(f"trust root version {version}, expires {expires}")
    if trust.get("rootProblem"):
        out.append(f"trust root refused: {trust['rootProblem'].get('message')}")
    if trust.get("blocked"):
        blocked = trust["blocked"]
        out.append(
            f"WARNING: every artifact is refused: {blocked.get('reason')}: {blocked.get('message')}"
        )
    hub = doc.get("hub")
    if hub:
        state = "connected" if hub.get("connected") else "not connected"
        line = f"hub {hub.get('hub')} as {hub.get('deviceName')}: {state}"
        line += f", generation {hub.get('generation', 0)}"
        if hub.get("lastError") and not hub.get("connected"):
            line += f" (last error: {hub['lastError']})"
        out.append(line)
        out += [
            f"  hub state refused for {p['workload'] or 'all'}: {p['reason']}: {p['message']}"
            for p in hub.get("problems", [])
        ]
    agent = doc.get("agent")
    if agent:  # edged.agent: the release running and its self-update (docs/agent-updates.md)
        where = f"slot {agent.get('slot')}" if agent.get("launcher") else "no launcher"
        line = f"agent {agent.get('version')} ({where}), committed {agent.get('committedVersion')}"
        line += f": {agent.get('phase')}"
        if agent.get("desiredVersion"):
            line += f", hub asks {agent['desiredVersion']}"
        if agent.get("reason"):
            line += f" ({agent['reason']}: {agent.get('message')})"
        out.append(line)
    compliance = dev.get("compliance")
    if compliance and compliance.get("compliant") is not None:
        verdict = "compliant" if compliance["compliant"] else "NOT compliant"
        line = f"drift: {verdict} (action {compliance.get('action')})"
        if compliance.get("opensWatched") is False:  # absent from an older edged: said nothing
            reason = (compliance.get("opensWatch") or {}).get("reason")
            line += f"; opens not watched: {reason}"
        out.append(line)
        if compliance.get("quarantined"):
            out.append(f"WARNING: {compliance['quarantined']}")
        out += [f"  drift: {f['kind']}: {f['message']}" for f in compliance.get("findings", [])]
    ingress = dev.get("ingress")
    if ingress:
        out += [f"  ingress: {p}" for p in ingress.get("problems", [])]
    rows = [("WORKLOAD", "MODEL", "VERSION", "PHASE", "READY", "RESTARTS", "PROVIDERS", "SANDBOX")]
    for w in doc.get("workloads", []):
        reps = w.get("replicas", [])
        providers = sorted({p for r in reps for p in r.get("providers", [])})
        rows.append(
            (
                w["name"],
                w.get("model", {}).get("name", "-"),
                w.get("model", {}).get("version", "-"),
                w.get("phase", "-"),
                f"{w.get('readyReplicas', 0)}/{w.get('desiredReplicas', 0)}",
                str(sum(r.get("restarts", 0) for r in reps)),
                ",".join(p.replace("ExecutionProvider", "") for p in providers) or "-",
                _sandbox_summary(reps),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    for w in doc.get("workloads", []):
        for c in w.get("conditions", []):
            if c["type"] != "Ready" or c["status"] != "True":
                out.append(
                    f"  {w['name']}: {c['type']}={c['status']} {c['reason']}: {c['message']}"
                )
    out += _termination_lines(doc)
    out += _sizing_lines(doc)
    for p in doc.get("source", {}).get("problems", []):
        where = p["file"] + (f" ({p['workload']})" if p["workload"] else "")
        out.append(f"  manifest {where}: {p['reason']}: {p['message']}")
    return "\n".join(out)


def termination_text(last: Mapping[str, Any]) -> str:
    """``OOMKilled (signal 9) at 2026-12-06T03:15:34Z: worker killed by ...``: a replica's
    last termination (edged's ``lastTermination``, the hub's too), for people."""
    how = (
        f"signal {last['signal']}" if last.get("signal") else f"exit code {last.get('exitCode', 0)}"
    )
    text = f"{last.get('reason', '?')} ({how})"
    finished = last.get("finishedAt")
    if isinstance(finished, int | float):
        when = datetime.fromtimestamp(finished, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        text += f" at {when}"
    if last.get("replica"):
        text += f", replica {last['replica']}"
    return text + (f": {last['message']}" if last.get("message") else "")


def _termination_lines(doc: dict[str, Any]) -> list[str]:
    """Each workload's last termination that edged did not ask for (OOMKilled...)."""
    return [
        f"  {w['name']}: last termination {termination_text(w['lastTermination'])}"
        for w in doc.get("workloads", [])
        if w.get("lastTermination")
    ]


def _sizing_lines(doc: dict[str, Any]) -> list[str]:
    """Autoscaling, eviction and memory-aware batching, when edged reports them."""
    out = []
    memory = doc.get("device", {}).get("memory")
    if memory and memory.get("memoryAvailable") is not None:
        mib = 1 << 20
        out.append(
            f"memory available {memory['memoryAvailable'] // mib}Mi, eviction floor "
            f"{memory['memoryAvailableFloor'] // mib}Mi"
            + (" (under pressure)" if memory.get("underPressure") else "")
        )
    for w in doc.get("workloads", []):
        scaling = w.get("scaling")
        if scaling:
            line = (
                f"  {w['name']}: scaling {scaling['minReplicas']}..{scaling['maxReplicas']}, "
                f"{scaling['currentReplicas']} ready, {scaling['desiredReplicas']} desired"
            )
            last = scaling.get("lastDecision")
            if last:
                line += f"; last {last['from']} -> {last['to']} {last['reason']}: {last['message']}"
            out.append(line)
        batching = w.get("batching")
        if batching and batching["effectiveMaxBatchSize"] < batching["maxBatchSize"]:
            out.append(
                f"  {w['name']}: batches of at most {batching['effectiveMaxBatchSize']} rows "
                f"(maxBatchSize {batching['maxBatchSize']}: memory is short)"
            )
    return out
