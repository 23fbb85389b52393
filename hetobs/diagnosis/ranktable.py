"""The per-rank state table of a report: where each rank was at the incident.

One row per rank of the world (16,384 rows at scale, built in one pass): the op and
sequence id it was in, its state (in_op, not_joined, failed, idle, or its stage-1
reachability: dead, stopped, silent, exited, no_dump) and, for ranks waiting in a
stuck collective, the ranks they wait for.
"""

from __future__ import annotations

from .job import LoadedJob
from .matcher import Stuck
from .reach import Reach
from .types import RankState

__all__ = ["rank_table"]


def rank_table(job: LoadedJob, reach: dict[int, Reach], stuck: list[Stuck]) -> list[RankState]:
    ws = job.world_size or 0
    stuck_of: dict[int, Stuck] = {}
    role: dict[int, str] = {}
    awaited: dict[int, list[int]] = {}  # id(stuck) -> the ranks its waiting ranks wait for
    for st in stuck:
        awaited[id(st)] = sorted(set(st.not_joined) | set(st.no_dump))[:8]
        for r in st.failed:
            role.setdefault(r, "failed")
            stuck_of.setdefault(r, st)
        for r in st.waiting:
            role.setdefault(r, "in_op")
            stuck_of.setdefault(r, st)
    for st in stuck:  # absent from one stuck op but held in another: the row shows where it is held
        for r in st.members:
            stuck_of.setdefault(r, st)
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
        st = stuck_of.get(r)
        comm = st.comm if st is not None else next(iter(d.comms), None)
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
            waiting_on = [p.peer for p in view.in_flight.peers
                          if p.recv_posted is not None and p.received is not None and p.received < p.recv_posted]
        elif view is not None and view.recent:
            last = view.recent[-1]
            op, seq = last.op, last.seq or last.p2p_seq
            if state == "idle" and last.state == "failed":
                state = "failed"
        if st is not None and state == "in_op" and role.get(r) == "in_op":
            waiting_on = awaited[id(st)] or waiting_on
        rows.append(RankState(r, host, op, seq, state, waiting_on[:8], comm))
    return rows
