"""Synthetic hetobs dumps and job directories for the diagnosis tests (no processes).

In the style of torch's test_fr_analysis.py `create_one_event(...)`: small factories
(`make_entry`, `make_peer`, `make_in_flight`, `make_comm`, `make_dump`, `make_meta`)
that fill every field of docs/dump-schema.md with plausible values, and `JobSpec`,
which builds a whole job (metadata + one incident) whose ranks are all stuck in the
same collective, for each test to bend into its scenario before writing it out.

Dumps default to the current format, 2.1 (`DUMP_VERSION`): an in-flight op carries
`waiting_on`, derived from its peers' progress as the native core derives it. A test
gives `cause_info` where it means the fields to speak; without it the reader falls back
to the `cause` text, as it does for any dump that lacks the fields.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Iterable, Optional

DUMP_VERSION = "2.1"  # docs/dump-schema.md: what the runtime writes today
RANK_VERSION = "2.0"
T0 = 1_764_500_000_000_000_000  # wall clock of the incident, ns
HOST_KEY = "boot-1234:4026531840"  # "this host" in tests that fake /proc
OTHER_HOST_KEY = "boot-9999:4026530000"


def make_entry(seq: int, *, op: str = "all_reduce", state: str = "completed", comm: int = 0, rank: int = 0,
               size: int = 4, dtype: str = "float32", count: int = 262144, root: Optional[int] = None,
               started_ns: Optional[int] = None, duration_ns: int = 1_000_000, record_id: Optional[int] = None,
               error: Optional[str] = None, p2p_seq: int = 0, peer: Optional[int] = None) -> dict[str, Any]:
    """One op record with every field the schema lists (FR names plus hetobs additions)."""
    started = T0 - (100 - seq) * 10_000_000 if started_ns is None else started_ns
    done = started + duration_ns if state == "completed" else None
    nbytes = count * 4
    return {
        "record_id": seq if record_id is None else record_id, "pg_id": comm,
        "collective_seq_id": seq if not p2p_seq else 0,
        "p2p_seq_id": p2p_seq, "profiling_name": f"hetobs:{op}", "input_sizes": [[count]], "output_sizes": [[count]],
        "input_dtypes": [dtype], "output_dtypes": [dtype], "state": state, "time_created_ns": started - 1000,
        "time_discovered_started_ns": started if state != "scheduled" else None,
        "time_discovered_completed_ns": done, "duration_ms": (duration_ns / 1e6) if done else None,
        "op": op, "comm_id": comm, "dtype": dtype, "count": count, "out_count": count, "bytes": nbytes,
        "reduction": "sum" if "reduce" in op else None, "root": root, "peer": peer, "algorithm": "ring",
        "backend": "native", "device_type": "cpu", "comm_size": size, "comm_rank": rank,
        "algbw_gbps": nbytes / duration_ns if done else None,
        "busbw_gbps": 1.5 * nbytes / duration_ns if done else None,
        "error": error,
    }


def make_peer(peer: int, *, sent: int = 0, received: int = 0, posted: int = 6, since_s: float = 5.0,
              transport: str = "shm", acked: Optional[int] = None) -> dict[str, Any]:
    """Progress with one peer; a direction with nothing moved has nothing posted (as the core writes it)."""
    return {"peer": peer, "global_peer": peer, "transport": transport,
            "send": {"posted": posted if sent else 0, "sent": sent, "acked": sent if acked is None else acked,
                     "done": sent},
            "recv": {"posted": posted if received else 0, "received": received, "done": received},
            "last_change_ns": T0 - int(since_s * 1e9), "seconds_since_change": since_s}


def waiting_on(peers: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`in_flight.waiting_on` (2.1) as the native core derives it: each peer and direction with
    messages posted and not done."""
    out = []
    for p in peers:
        for direction in ("recv", "send"):
            d = p.get(direction) or {}
            if (d.get("posted") or 0) > (d.get("done") or 0):
                out.append({"rank": p["global_peer"], "direction": direction, "posted": d["posted"],
                            "done": d.get("done") or 0})
    return out


def make_in_flight(seq: int, *, op: str = "all_reduce", peers: Iterable[dict[str, Any]] = (), seconds: float = 5.0,
                   dtype: str = "float32", count: int = 262144, root: Optional[int] = None,
                   state: str = "started") -> dict[str, Any]:
    peers = list(peers)
    return {"record_id": seq, "collective_seq_id": seq, "p2p_seq_id": 0, "op": op, "dtype": dtype, "count": count,
            "bytes": count * 4, "root": root, "peer": None, "algorithm": "ring", "state": state,
            "time_created_ns": T0 - int(seconds * 1e9) - 1000, "time_discovered_started_ns": T0 - int(seconds * 1e9),
            "seconds_in_op": seconds, "peers": peers, "waiting_on": waiting_on(peers)}


def make_cause_info(kind: str, culprits: Iterable[int] = (), *, reporter: Optional[int] = None,
                    messengers: Iterable[int] = (), op: Optional[str] = None, seq: Optional[int] = None,
                    peer: Optional[int] = None, gone: bool = False) -> dict[str, Any]:
    """`cause_info` (2.1) of a dump or a failed comm."""
    return {"kind": kind, "culprits": list(culprits), "reporter": reporter, "messengers": list(messengers),
            "op": op, "seq": seq, "peer": peer, "gone": gone}


def make_comm(comm_id: int, ranks: list[int], rank: int, *, last_coll_seq: int, in_flight: Optional[dict] = None,
              failed: bool = False, cause: Optional[str] = None, links: Optional[list[dict]] = None,
              ring: Optional[list[int]] = None) -> dict[str, Any]:
    return {"comm_id": comm_id, "size": len(ranks), "rank": ranks.index(rank) if rank in ranks else -1,
            "global_ranks": list(ranks), "ring": list(ring if ring is not None else ranks),
            "last_coll_seq": last_coll_seq, "last_p2p_seq": 0, "failed": failed, "cause": cause,
            "in_flight": in_flight, "links": links or []}


def make_link(peer: int, *, bytes_sent: int = 0, busy_ns: int = 0, transport: str = "tcp") -> dict[str, Any]:
    return {"peer": peer, "global_peer": peer, "transport": transport, "bytes_sent": bytes_sent,
            "bytes_recv": bytes_sent, "busy_ns": busy_ns, "last_activity_ns": T0}


def stacks(func: str = "step", path: str = "/app/train.py", line: int = 42) -> str:
    return ("Thread 0x00007f0000000002 (most recent call first):\n"
            '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
            '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
            "Current thread 0x00007f0000000001 (most recent call first):\n"
            f'  File "{path}", line {line} in {func}\n'
            f'  File "{path}", line 90 in <module>\n')


def make_dump(rank: int, world: int, *, incident: str = "hang-c0-s17", comms: Optional[list[dict]] = None,
              entries: Optional[list[dict]] = None, reason: str = "peer_request", cause: Optional[str] = None,
              time_ns: int = T0, host: Optional[str] = None, pid: Optional[int] = None,
              side_channel: Optional[dict] = None, python: Optional[dict] = None, hang_timeout_s: float = 3.0,
              job: str = "job1", version: str = DUMP_VERSION, cause_info: Optional[dict] = None) -> dict[str, Any]:
    return {
        "schema": "hetobs.dump", "version": version, "job": job, "incident": incident, "rank": rank,
        "world_size": world, "host": host or f"node{rank // 2}", "pid": pid or 1000 + rank,
        "process_start_time": 5000 + rank, "reason": reason, "cause": cause, "cause_info": cause_info,
        "requested_by": 0 if reason == "peer_request" else None, "time_ns": time_ns,
        "heartbeat_ns": time_ns - 10_000_000, "last_progress_ns": time_ns - int(hang_timeout_s * 1e9),
        "hang_timeout_s": hang_timeout_s,
        "side_channel": side_channel or {"asked": [], "answered": [], "unanswered": []},
        "comms": comms or [], "entries": entries or [],
        "python": python or {"status": "ok", "stacks": stacks()},
    }


def make_meta(rank: int, world: int, *, host: Optional[str] = None, host_key: str = OTHER_HOST_KEY,
              pid: Optional[int] = None, exited_cleanly: bool = False, exit_time_ns: Optional[int] = None,
              comms: Optional[list[dict]] = None, job: str = "job1", hang_timeout_s: float = 3.0) -> dict[str, Any]:
    ranks = list(range(world))
    return {
        "schema": "hetobs.rank", "version": RANK_VERSION, "job": job, "rank": rank, "world_size": world,
        "host": host or f"node{rank // 2}", "host_key": host_key, "pid": pid or 1000 + rank,
        "process_start_time": 5000 + rank, "start_time_ns": T0 - 60_000_000_000,
        "side_channel": {"ip": "10.0.0.1", "port": 40000 + rank},
        "stats_segment": f"/dev/shm/hetobs-stats-{job}-r{rank}", "hang_timeout_s": hang_timeout_s,
        "comms": comms if comms is not None else [
            {"comm_id": 0, "size": world, "rank": rank, "global_ranks": ranks, "ring": ranks,
             "transports": {str((rank + 1) % world): "shm", str((rank - 1) % world): "shm"}}],
        "exited_cleanly": exited_cleanly, "exit_time_ns": exit_time_ns,
    }


def ring_progress(ring: list[int], *, stalled_link: Optional[tuple[int, int]] = None,
                  stalled_rank: Optional[int] = None) -> dict[int, tuple[int, int]]:
    """Consistent ring counters: rank -> (received from prev, sent to next).

    Every rank forwards what it received plus one, except at the fault: the stalled
    link's receiver got 1 frame whatever its sender sent; the stalled rank sent 1.
    """
    n = len(ring)
    out: dict[int, tuple[int, int]] = {}
    if stalled_link is not None:
        start = ring.index(stalled_link[1])
        recv = 1
        for k in range(n):
            r = ring[(start + k) % n]
            out[r] = (recv, recv + 1)
            recv = recv + 1
        return out
    if stalled_rank is not None:
        i = ring.index(stalled_rank)
        sent = 1
        for k in range(1, n):
            r = ring[(i + k) % n]
            out[r] = (sent, sent + 1)
            sent += 1
        out[stalled_rank] = (sent, 1)
        return out
    for r in ring:  # everybody moved the same amount: nothing in flight anywhere
        out[r] = (3, 3)
    return out


class JobSpec:
    """A job of `world` ranks on comm 0, all in `op` seq `seq` for `seconds`, ready to bend.

    `metas[r]` / `dumps[r]` are plain dicts (set one to None to leave the file out);
    `write(root)` lays out `root/<job>/ranks/...` and `incidents/<incident>/...`.
    """

    def __init__(self, world: int = 4, *, seq: int = 17, incident: str = "hang-c0-s17", job: str = "job1",
                 seconds: float = 5.0, hang_timeout_s: float = 3.0, history: int = 20,
                 progress: Optional[dict[int, tuple[int, int]]] = None, host_key: str = OTHER_HOST_KEY) -> None:
        self.world, self.seq, self.incident, self.job = world, seq, incident, job
        ring = list(range(world))
        progress = progress or ring_progress(ring)
        self.metas: dict[int, Optional[dict[str, Any]]] = {
            r: make_meta(r, world, job=job, host_key=host_key, hang_timeout_s=hang_timeout_s) for r in ring}
        self.dumps: dict[int, Optional[dict[str, Any]]] = {}
        for r in ring:
            prev, nxt = ring[r - 1], ring[(r + 1) % world]
            recv, sent = progress[r]
            peers = [make_peer(nxt, sent=sent, received=0, since_s=seconds),
                     make_peer(prev, sent=0, received=recv, since_s=seconds)] if world > 2 else \
                [make_peer(nxt, sent=sent, received=recv, since_s=seconds)]
            entries = [make_entry(s, rank=r, size=world) for s in range(max(1, seq - history), seq)]
            entries.append(make_entry(seq, rank=r, size=world, state="started"))
            self.dumps[r] = make_dump(
                r, world, incident=incident, job=job, hang_timeout_s=hang_timeout_s,
                reason="watchdog" if r == 0 else "peer_request",
                cause=f"all_reduce seq {seq} on comm 0: no progress for {seconds} s" if r == 0 else None,
                side_channel={"asked": [x for x in ring if x != 0], "answered": [x for x in ring if x != 0],
                              "unanswered": []} if r == 0 else None,
                comms=[make_comm(0, ring, r, last_coll_seq=seq - 1,
                                 in_flight=make_in_flight(seq, peers=peers, seconds=seconds))],
                entries=entries)

    # --- bending helpers ---------------------------------------------------------
    def comm(self, rank: int, comm_id: int = 0) -> dict[str, Any]:
        dump = self.dumps[rank]
        assert dump is not None
        return next(c for c in dump["comms"] if c["comm_id"] == comm_id)

    def not_joined(self, rank: int, *, where: str = "sleep", line: int = 88) -> None:
        """`rank` finished seq-1 and sits in Python instead of calling seq."""
        dump = self.dumps[rank]
        assert dump is not None
        c = self.comm(rank)
        c["in_flight"] = None
        c["last_coll_seq"] = self.seq - 1
        dump["entries"] = [e for e in dump["entries"] if e["collective_seq_id"] < self.seq]
        dump["python"] = {"status": "ok", "stacks": stacks(where, "/app/rank_programs.py", line)}

    def drop_dump(self, rank: int) -> None:
        self.dumps[rank] = None
        d0 = self.dumps[0]
        if d0 is not None and rank != 0:
            sc = d0["side_channel"]
            sc["answered"] = [x for x in sc["answered"] if x != rank]
            sc["unanswered"] = sorted(set(sc["unanswered"]) | {rank})

    def fail_all(self, cause_for: dict[int, str]) -> None:
        """Every listed rank errored (reason error, comm failed with that cause)."""
        for r, cause in cause_for.items():
            dump = self.dumps[r]
            assert dump is not None
            dump["reason"] = "error"
            dump["cause"] = cause
            c = self.comm(r)
            c["failed"], c["cause"], c["in_flight"] = True, cause, None
            dump["entries"][-1]["state"] = "failed"
            dump["entries"][-1]["error"] = cause

    def write(self, root: Path) -> Path:
        job_dir = Path(root) / self.job
        (job_dir / "ranks").mkdir(parents=True, exist_ok=True)
        inc = job_dir / "incidents" / self.incident
        inc.mkdir(parents=True, exist_ok=True)
        for r, meta in self.metas.items():
            if meta is not None:
                (job_dir / "ranks" / f"rank-{r}.json").write_text(json.dumps(meta))
        for r, dump in self.dumps.items():
            if dump is not None:
                (inc / f"rank-{r}.json").write_text(json.dumps(dump))
        return job_dir

    def copy(self) -> "JobSpec":
        return copy.deepcopy(self)


def fake_proc(root: Path, processes: dict[int, tuple[str, int]], host_key: str = HOST_KEY) -> Path:
    """A fake /proc: pid -> (state letter, start time). Returns the root to pass as proc_root."""
    boot, _, _ = host_key.partition(":")
    (root / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "sys/kernel/random/boot_id").write_text(boot + "\n")
    (root / "self/ns").mkdir(parents=True, exist_ok=True)
    (root / "self/ns/net").write_text("")
    for pid, (state, start) in processes.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        fields = [state, "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start)] + ["0"] * 10
        (root / str(pid) / "stat").write_text(f"{pid} (python3 x) " + " ".join(fields) + "\n")
    return root


def local_key(proc_root: Path) -> str:
    boot = (proc_root / "sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}:{os.stat(proc_root / 'self/ns/net').st_ino}"


# --- Flight Recorder dumps ---------------------------------------------------------

def make_fr_entry(seq: int, *, pg: str = "0", desc: str = "default_pg", backend: str = "nccl",
                  op: str = "all_reduce", state: str = "completed", sizes: Optional[list] = None,
                  dtype: str = "Float", record_id: Optional[int] = None, started_ns: Optional[int] = None) -> dict:
    t = T0 - (300 - seq) * 10_000_000 if started_ns is None else started_ns
    return {"record_id": seq - 1 if record_id is None else record_id, "pg_id": int(pg) if pg.isdigit() else 0,
            "process_group": [pg, desc], "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"{backend}:{op}", "time_created_ns": t - 1000,
            "input_sizes": sizes if sizes is not None else [[1024]], "input_dtypes": [dtype],
            "output_sizes": sizes if sizes is not None else [[1024]], "output_dtypes": [dtype], "state": state,
            "time_discovered_started_ns": (t if state != "scheduled" else None) if backend == "nccl" else None,
            "time_discovered_completed_ns": (t + 500_000 if state == "completed" else None) if backend == "nccl"
            else None,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False,
            "frames": [{"name": "all_reduce", "filename": "/site-packages/torch/distributed/distributed_c10d.py",
                        "line": 3245},
                       {"name": "train_step", "filename": "/app/train.py", "line": 42}]}


def make_fr_dump(world: int, entries: list[dict], *, gloo: bool = False, version: str = "2.10") -> dict:
    pg_config = {"": {"name": "", "desc": "", "ranks": "[]"}} if gloo else {
        "0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(world)))}}
    return {"version": version, "comm_lib_version": "", "nccl_comm_state": {}, "pg_config": pg_config,
            "pg_status": {}, "entries": entries}
