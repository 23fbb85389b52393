"""Recorded ops as Chrome / Perfetto trace events, so a person can look at a stall.

One process track per rank ("rank 3 (node7)") and one thread track per communicator
in it, one complete ("X") event per op with its sequence id, bytes, dtype and
bandwidths as args. Ops still in flight run to the moment of the dump (or the live
read) and are marked `in_flight`; failed ones carry their error. Each dump adds an
instant event with its cause. Times are microseconds from the earliest event
(`otherData.origin_unix_ns` holds it), which keeps sub-microsecond precision that
absolute epoch microseconds in a JSON double would lose.

Hierarchical (island) ops also get a track per phase under their communicator's
("comm 5: vendor", "... d2h", "... wire", "... h2d"): the relay is pipelined, so the
phases overlap and only each one's busy time is recorded, not when it ran. Each phase
slice therefore starts at the op's start and lasts that phase's busy time; read the
lengths side by side, not the positions. The op's own slice carries its island, chunk
count and phase times as args, and an op in flight at a dump its current phase.

Sources: an incident's dumps (docs/dump-schema.md `entries`), or the live record
rings of the ranks on this node (a `Snapshot` read with records).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from hetobs.stats import ISLAND_PHASES as PHASES  # phase tracks of an island op, in this order

from .source import Snapshot

__all__ = ["TraceError", "latest_incident", "events_from_incident", "events_from_snapshot", "build", "write"]

_TRACK_ORDER = {p: i + 1 for i, p in enumerate(PHASES)}


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
    phases = e.get("phases")
    if e.get("island"):
        args["island"] = e["island"]
    if isinstance(phases, dict):
        args.update({k: v for k, v in phases.items() if isinstance(v, int)})
    if in_flight and e.get("phase"):
        args["phase"] = e["phase"]
    ev = {"name": f"{op} #{e.get('p2p_seq_id' if p2p else 'collective_seq_id')}", "cat": "p2p" if p2p else "collective",
          "ph": "X", "pid": rank, "tid": comm, "ts": int(start), "dur": max(0, int(end) - int(start)), "args": args}
    if state == "failed":
        ev["cname"] = "terrible"
    elif in_flight:
        ev["cname"] = "bad"
    return ev


def _phase_events(op_ev: dict[str, Any], e: dict[str, Any]) -> list[dict[str, Any]]:
    """One slice per busy phase of a finished island op, each on its phase's track."""
    phases = e.get("phases")
    if not isinstance(phases, dict) or op_ev["args"].get("in_flight"):
        return []
    out = []
    for name in PHASES:
        ns = phases.get(f"{name}_ns")
        if type(ns) is not int or ns <= 0:
            continue
        args = {"phase": name, "busy_ns": ns, "island": e.get("island"), "chunks": phases.get("chunks"),
                **{k: op_ev["args"][k] for k in ("record_id", "collective_seq_id", "p2p_seq_id", "comm_id")
                   if k in op_ev["args"]}}
        out.append({"name": f"{name} ({op_ev['name']})", "cat": "island_phase", "ph": "X", "pid": op_ev["pid"],
                    "tid": op_ev["tid"], "phase": name, "ts": op_ev["ts"], "dur": ns, "args": args})
    return out


def _events(rank: int, comm: int, e: dict[str, Any], end_default: int | None) -> list[dict[str, Any]]:
    ev = _op_event(rank, comm, e, end_default)
    return [] if ev is None else [ev, *_phase_events(ev, e)]


def events_from_incident(job_dir: str, incident: str) -> tuple[list[dict[str, Any]], dict[int, str], list[str]]:
    """(raw events in ns, rank -> host, problems) from every dump of one incident."""
    from hetobs.diagnosis.untrusted import RefusedPath, SafeDir

    folder = Path(job_dir) / "incidents" / incident
    if "/" in incident or incident in (".", ".."):
        raise TraceError(f"incident {incident!r}: expected a plain name")
    docs: list[tuple[Path, bytes]] = []
    problems: list[str] = []
    try:  # untrusted files: no link followed (below the job directory), regular files only
        with SafeDir.open_root(Path(job_dir)) as root, root.subdir("incidents") as incs, incs.subdir(incident) as inc:
            for name, _kind in inc.entries():
                if not (name.startswith("rank-") and name.endswith(".json")):
                    continue
                try:
                    docs.append((folder / name, inc.read(name)))
                except OSError as e:
                    why = e.strerror if isinstance(e, RefusedPath) else f"unreadable ({e})"
                    problems.append(f"{folder / name}: {why}")
    except RefusedPath as e:
        raise TraceError(f"{e.filename}: {e.strerror}") from None
    except OSError:
        raise TraceError(f"{folder}: no such incident") from None
    events: list[dict[str, Any]] = []
    hosts: dict[int, str] = {}
    for path, data in docs:
        try:
            doc = json.loads(data)
        except ValueError as e:
            problems.append(f"{path}: unreadable ({e})")
            continue
        if not isinstance(doc, dict) or doc.get("schema") != "hetobs.dump" or not str(
                doc.get("version", "")).startswith(("1.", "2.")):
            problems.append(f"{path}: not a hetobs.dump 1.x or 2.x document")
            continue
        rank, when = int(doc.get("rank", -1)), doc.get("time_ns")
        hosts[rank] = str(doc.get("host", ""))
        phase_now = _in_flight_phases(doc)
        for entry in doc.get("entries") or []:
            comm = int(entry.get("comm_id", entry.get("pg_id", 0)))
            if entry.get("record_id") in phase_now:
                entry = dict(entry, phase=phase_now[entry["record_id"]])
            events += _events(rank, comm, entry, when)
        if when:
            events.append({"name": f"dump: {doc.get('reason', '')}", "ph": "i", "s": "p", "pid": rank, "tid": -1,
                           "ts": int(when), "args": {"incident": incident, "cause": doc.get("cause")}})
    if not hosts:
        raise TraceError(f"{folder}: no readable dump" + (f" ({'; '.join(problems)})" if problems else ""))
    return events, hosts, problems


def _in_flight_phases(doc: dict[str, Any]) -> dict[int, str]:
    """record id -> current phase of each island op in flight at the dump (comms[*].in_flight.phase)."""
    out: dict[int, str] = {}
    for c in doc.get("comms") or []:
        f = c.get("in_flight") if isinstance(c, dict) else None
        if isinstance(f, dict) and isinstance(f.get("phase"), str) and isinstance(f.get("record_id"), int):
            out[f["record_id"]] = f["phase"]
    return out


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
            events += _events(entry.rank, int(r["comm_id"]), r, snap.time_ns)
    if not hosts:
        raise TraceError(f"job {snap.job}: no readable stats segment on this node"
                         + (f" ({'; '.join(problems)})" if problems else ""))
    return events, hosts, problems


def build(raw: Iterable[dict[str, Any]], hosts: dict[int, str], source: str) -> dict[str, Any]:
    """The trace document: small thread ids per track, times in µs from the earliest event.

    A track is a communicator's ops, or one phase of its island ops (right after it).
    """
    raw = list(raw)
    origin = min((e["ts"] for e in raw), default=0)

    def track(e: dict[str, Any]) -> tuple[int, int]:
        return e["tid"], _TRACK_ORDER.get(e.get("phase", ""), 0)

    tracks = sorted({track(e) for e in raw if e["tid"] != -1})
    tid = {t: i + 1 for i, t in enumerate(tracks)}  # 64-bit comm ids would not survive a JSON double
    out: list[dict[str, Any]] = []
    for rank, host in sorted(hosts.items()):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank} ({host})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
    for rank, t in sorted({(e["pid"], track(e)) for e in raw if e["tid"] != -1}):
        name = f"comm {t[0]}" + (f": {PHASES[t[1] - 1]}" if t[1] else "")
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid[t], "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid[t], "args": {"sort_index": tid[t]}})
    for e in sorted(raw, key=lambda e: (e["pid"], e["ts"])):
        ev = dict(e, ts=(e["ts"] - origin) / 1000.0, tid=tid.get(track(e), 0) if e["tid"] != -1 else 0)
        ev.pop("phase", None)
        if "dur" in ev:
            ev["dur"] = e["dur"] / 1000.0
        out.append(ev)
    other: dict[str, Any] = {"source": source, "origin_unix_ns": origin,
                             "comms": {str(tid[t]): str(t[0]) for t in tracks}}
    if any(t[1] for t in tracks):
        other["phases"] = {str(tid[t]): PHASES[t[1] - 1] for t in tracks if t[1]}
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}


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
