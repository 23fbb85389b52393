"""Recorded ops as Chrome / Perfetto trace events, so a person can look at a stall.

One process track per rank ("rank 3 (node7)") and one thread track per communicator
in it, one complete ("X") event per op with its sequence id, bytes, dtype and
bandwidths as args. Ops still in flight run to the moment of the dump (or the live
read) and are marked `in_flight`; failed ones carry their error. Each dump adds an
instant event with its cause. Times are microseconds from the earliest event
(`otherData.origin_unix_ns` holds it), which keeps sub-microsecond precision that
absolute epoch microseconds in a JSON double would lose.

Sources: an incident's dumps (docs/dump-schema.md `entries`), or the live record
rings of the ranks on this node (a `Snapshot` read with records).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from .source import Snapshot

__all__ = ["TraceError", "latest_incident", "events_from_incident", "events_from_snapshot", "build", "write"]


class TraceError(ValueError):
    """Nothing to draw: no incident, no readable dump, no records."""


def latest_incident(job_dir: str) -> str | None:
    """The incident whose newest dump is the newest (by each dump's `time_ns`, not folder order)."""
    from hetobs.diagnosis.loader import incident_time_ns, list_incidents

    base = Path(job_dir)
    best: tuple[int, str] | None = None
    for name in list_incidents(base):
        t = incident_time_ns(base / "incidents" / name)
        if t is not None and (best is None or t > best[0]):
            best = (t, name)
    return best[1] if best else None


def _op_event(rank: int, comm: int, e: dict[str, Any], end_default: int | None) -> dict[str, Any] | None:
    start = e.get("time_discovered_started_ns") or e.get("time_created_ns")
    end = e.get("time_discovered_completed_ns")
    state = e.get("state")
    in_flight = not end and state not in ("completed", "failed")
    if in_flight:
        end = end_default
    if not start or not end:
        return None
    op = e.get("op") or str(e.get("profiling_name", "op")).split(":")[-1]
    p2p = op in ("send", "recv")
    args = {k: e.get(k) for k in ("record_id", "collective_seq_id", "p2p_seq_id", "bytes", "dtype", "count",
                                  "algorithm", "algbw_gbps", "busbw_gbps", "state", "error") if e.get(k) is not None}
    for k in ("root", "peer", "root_or_peer"):
        if e.get(k) is not None and e.get(k) != -1:
            args[k] = e[k]
    args["comm_id"] = comm
    if in_flight:
        args["in_flight"] = True
    ev = {"name": f"{op} #{e.get('p2p_seq_id' if p2p else 'collective_seq_id')}", "cat": "p2p" if p2p else "collective",
          "ph": "X", "pid": rank, "tid": comm, "ts": int(start), "dur": max(0, int(end) - int(start)), "args": args}
    if state == "failed":
        ev["cname"] = "terrible"
    elif in_flight:
        ev["cname"] = "bad"
    return ev


def events_from_incident(job_dir: str, incident: str) -> tuple[list[dict[str, Any]], dict[int, str], list[str]]:
    """(raw events in ns, rank -> host, problems) from every dump of one incident."""
    folder = Path(job_dir) / "incidents" / incident
    if not folder.is_dir():
        raise TraceError(f"{folder}: no such incident")
    events: list[dict[str, Any]] = []
    hosts: dict[int, str] = {}
    problems: list[str] = []
    for path in sorted(folder.glob("rank-*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            problems.append(f"{path}: unreadable ({e})")
            continue
        if not isinstance(doc, dict) or doc.get("schema") != "hetobs.dump" or not str(
                doc.get("version", "")).startswith("1."):
            problems.append(f"{path}: not a hetobs.dump 1.x document")
            continue
        rank, when = int(doc.get("rank", -1)), doc.get("time_ns")
        hosts[rank] = str(doc.get("host", ""))
        for entry in doc.get("entries") or []:
            comm = int(entry.get("comm_id", entry.get("pg_id", 0)))
            ev = _op_event(rank, comm, entry, when)
            if ev is not None:
                events.append(ev)
        if when:
            events.append({"name": f"dump: {doc.get('reason', '')}", "ph": "i", "s": "p", "pid": rank, "tid": -1,
                           "ts": int(when), "args": {"incident": incident, "cause": doc.get("cause")}})
    if not hosts:
        raise TraceError(f"{folder}: no readable dump" + (f" ({'; '.join(problems)})" if problems else ""))
    return events, hosts, problems


def events_from_snapshot(snap: Snapshot) -> tuple[list[dict[str, Any]], dict[int, str], list[str]]:
    """(raw events in ns, rank -> host, problems) from the live record rings."""
    events: list[dict[str, Any]] = []
    hosts: dict[int, str] = {}
    problems: list[str] = []
    for entry in snap.ranks:
        if entry.stats is None:
            if entry.problem:
                problems.append(f"rank {entry.rank}: {entry.detail}")
            continue
        hosts[entry.rank] = entry.host
        for rec in entry.stats.records:
            r: dict[str, Any] = rec
            ev = _op_event(entry.rank, int(r["comm_id"]), r, snap.time_ns)
            if ev is not None:
                events.append(ev)
    if not hosts:
        raise TraceError(f"job {snap.job}: no readable stats segment on this node"
                         + (f" ({'; '.join(problems)})" if problems else ""))
    return events, hosts, problems


def build(raw: Iterable[dict[str, Any]], hosts: dict[int, str], source: str) -> dict[str, Any]:
    """The trace document: small thread ids per communicator, times in µs from the earliest event."""
    raw = list(raw)
    origin = min((e["ts"] for e in raw), default=0)
    comms = sorted({e["tid"] for e in raw if e["tid"] != -1})
    tid = {c: i + 1 for i, c in enumerate(comms)}  # 64-bit comm ids would not survive a JSON double
    out: list[dict[str, Any]] = []
    for rank, host in sorted(hosts.items()):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank} ({host})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
    for rank, comm in sorted({(e["pid"], e["tid"]) for e in raw if e["tid"] != -1}):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid[comm], "args": {"name": f"comm {comm}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid[comm],
                    "args": {"sort_index": tid[comm]}})
    for e in sorted(raw, key=lambda e: (e["pid"], e["ts"])):
        ev = dict(e, ts=(e["ts"] - origin) / 1000.0, tid=tid.get(e["tid"], 0))
        if "dur" in ev:
            ev["dur"] = e["dur"] / 1000.0
        out.append(ev)
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"source": source, "origin_unix_ns": origin, "comms": {str(tid[c]): str(c) for c in comms}}}


def write(doc: dict[str, Any], path: str) -> None:
    """Write atomically (temp file in the same folder, then rename); no temp file is left on failure."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
