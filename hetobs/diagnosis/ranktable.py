"""The per-rank state table of a report: where each rank was at the incident.

One row per rank of the world (16,384 rows at scale, built in one pass): the op and
sequence id it was in, its state (in_op, not_joined, failed, idle, or its stage-1
reachability: dead, stopped, silent, exited, no_dump) and, for ranks waiting in a
stuck collective, the ranks they wait for: those that never joined it where the stuck op has
any (the cause behind the chain), else whom the rank's own dump says it waits on.
"""

from __future__ import annotations

from .job import LoadedJob
from .matcher import Stuck
from .reach import Reach
from .summary import InFlight
from .types import RankState

__all__ = ["rank_table"]


def _own_waits(f: InFlight) -> list[int]:
    """Whom an in-flight op waits on, as its rank saw it: the dump's `waiting_on` (2.1), else
    (older dumps) the peers it has not received everything from, from the progress counters."""
    if f.waits is not None:
        return f.waited_ranks()
    return [p.peer for p in f.peers
            if p.recv_posted is not None and p.received is not None and p.received < p.recv_posted]


def rank_table(job: LoadedJob, reach: dict[int, Reach], stuck: list[Stuck]) -> list[RankState]:
    ws = job.world_size or 0
    held: dict[int, int] = {}  # rank -> index in `stuck` of the op the row shows it in
    role: dict[int, str] = {}
    awaited = [sorted(set(st.not_joined) | set(st.no_dump))[:8] for st in stuck]  # whom each op's waiters wait for
    for i, st in enumerate(stuck):
        for r in st.failed:
            role.setdefault(r, "failed")
            held.setdefault(r, i)
        for r in st.waiting:
            role.setdefault(r, "in_op")
            held.setdefault(r, i)
    for i, st in enumerate(stuck):  # absent from one stuck op but held in another: the row shows where it is held
        for r in st.members:
            held.setdefault(r, i)
        for r in st.not_joined:
            role.setdefault(r, "not_joined")
    rows: list[RankState] = []
    for r in range(ws):
        d = job.dumps.get(r)
        host = job.host_of(r)
        rc = reach.get(r)
        if d is None:
            state = rc.state if rc is not None and rc.state != "unknown" else "no_dump"
            rows.append(RankState(r, host, None, None, state))
            continue
        at = held.get(r)
        held_in = stuck[at] if at is not None else None
        comm = held_in.comm if held_in is not None else next(iter(d.comms), None)
        view = d.comms.get(comm) if comm is not None else None
        if view is None and d.comms:
            comm, view = next(iter(d.comms.items()))
        op = seq = None
        waiting_on: list[int] = []
        state = role.get(r, "idle")
        if view is not None and view.in_flight is not None:
            op, seq = view.in_flight.rec.op, view.in_flight.rec.seq or view.in_flight.rec.p2p_seq
            if state == "idle":
                state = "in_op"
            waiting_on = _own_waits(view.in_flight)
        elif view is not None and view.recent:
            last = view.recent[-1]
            op, seq = last.op, last.seq or last.p2p_seq
            if state == "idle" and last.state == "failed":
                state = "failed"
        if at is not None and state == "in_op" and role.get(r) == "in_op":
            waiting_on = awaited[at] or waiting_on
        rows.append(RankState(r, host, op, seq, state, waiting_on[:8], comm))
    return rows
