"""What the HTML report draws, as plain JSON-able data built from a Report and the loaded dumps.

Why a separate step: the page's script draws from this data only, so its size is
controlled here. At thousands of ranks every per-rank column is an index into a
string table (hosts, islands, ops and frames repeat), the timeline keeps only the
blamed ranks and their ring neighbours, and everyone else is summarized (state
counts, an arrival histogram, a bandwidth histogram). Nothing here is text for
people except what the dumps and the report already say.
"""

from __future__ import annotations

from typing import Any, Optional

from ..diagnosis.islands import island_of
from ..diagnosis.job import LoadedJob
from ..diagnosis.summary import CommView, Rec
from ..diagnosis.types import CommKey, Report

__all__ = ["build_view", "FOCUS_NEIGHBOURS", "MAX_TIMELINE_RANKS"]

FOCUS_NEIGHBOURS = 2  # ring neighbours on each side of a blamed rank kept in the timeline
MAX_TIMELINE_RANKS = 24  # rows of the timeline; a world this small is drawn whole


class _Strings:
    """A string table: columns hold small ints instead of repeated host names and frames."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, s: Optional[str]) -> int:
        if s is None:
            return -1
        i = self._index.get(s)
        if i is None:
            i = self._index[s] = len(self.items)
            self.items.append(s)
        return i


def _focus_comm(report: Report, job: Optional[LoadedJob]) -> Optional[CommKey]:
    for v in report.verdicts:
        if v.comm is not None:
            return v.comm
    counts: dict[CommKey, int] = {}
    for row in report.ranks:
        if row.comm is not None:
            counts[row.comm] = counts.get(row.comm, 0) + 1
    if counts:
        return max(counts, key=lambda c: counts[c])
    if job is not None and job.rings:
        return next(iter(job.rings))
    return None


def _phase_of(views: dict[CommKey, CommView]) -> Optional[str]:
    """The phase of a rank's in-flight hierarchical op (None when it is in none)."""
    for view in views.values():
        f = view.in_flight
        if f is not None and f.rec.island:
            return f.phase
    return None


def _ring_order(world: int, job: Optional[LoadedJob], comm: Optional[CommKey]) -> list[int]:
    """The focus communicator's ring (its members where no ring was recorded), then every other rank."""
    order: list[int] = []
    if job is not None and comm is not None:
        order = [r for r in (job.rings.get(comm) or job.members.get(comm) or ()) if 0 <= r < world]
    seen = set(order)
    if len(seen) != len(order):
        order, seen = list(dict.fromkeys(order)), set(order)
    return order + [r for r in range(world) if r not in seen]


def _rec_row(rec: Rec, t0: int, in_flight: bool) -> list[Any]:
    def rel(ns: Optional[int]) -> Optional[float]:
        return None if ns is None else round((ns - t0) / 1e6, 3)  # ms relative to the incident

    row: list[Any] = [rec.seq or rec.p2p_seq, rec.op, rel(rec.started_ns),
                      None if in_flight else rel(rec.completed_ns), rec.state, rec.nbytes]
    if rec.phases is not None:
        p = rec.phases
        row.append([round(p.vendor_ns / 1e6, 3), round(p.d2h_ns / 1e6, 3), round(p.wire_ns / 1e6, 3),
                    round(p.h2d_ns / 1e6, 3), p.chunks])
    return row


def _focus_ranks(order: list[int], blamed: list[int], links: list[list[int]]) -> list[int]:
    if len(order) <= MAX_TIMELINE_RANKS:
        return list(order)
    pos = {r: i for i, r in enumerate(order)}
    centres = [r for r in blamed if r in pos] + [r for lk in links for r in lk if r in pos]
    if not centres:
        centres = [order[0]]
    chosen: dict[int, None] = {}
    for c in centres:
        i = pos[c]
        for k in range(-FOCUS_NEIGHBOURS, FOCUS_NEIGHBOURS + 1):
            chosen[order[(i + k) % len(order)]] = None
        if len(chosen) >= MAX_TIMELINE_RANKS:
            break
    return sorted(list(chosen)[:MAX_TIMELINE_RANKS], key=lambda r: pos[r])


def _incident_seq(report: Report, job: Optional[LoadedJob], comm: Optional[CommKey]) -> Optional[int]:
    for v in report.verdicts:
        if v.comm == comm and v.seq is not None:
            return v.seq
    if job is None or comm is None:
        return None
    highest: dict[int, int] = {}
    for d in job.dumps.values():
        view = d.comms.get(comm)
        p = view.position() if view is not None else None
        if p:
            highest[p] = highest.get(p, 0) + 1
    return max(highest) if highest else None


def build_view(report: Report, job: Optional[LoadedJob]) -> dict[str, Any]:
    """The data the page's script draws (see the module doc); `job` may be None (report only)."""
    world = report.world_size or (max((r.rank for r in report.ranks), default=-1) + 1)
    comm = _focus_comm(report, job)
    order = _ring_order(world, job, comm)
    hosts, islands, ops, frames, states, phases = (_Strings() for _ in range(6))
    n = world
    col_state, col_host, col_island, col_op, col_where, col_phase = ([-1] * n for _ in range(6))
    col_seq: list[Optional[int]] = [None] * n
    col_wait: list[list[int]] = [[] for _ in range(n)]
    for row in report.ranks:
        if not 0 <= row.rank < n:
            continue
        r = row.rank
        col_state[r], col_host[r], col_op[r], col_seq[r] = states(row.state), hosts(row.host), ops(row.op), row.seq
        col_wait[r] = list(row.waiting_on)
    dumps = job.dumps if job is not None else {}
    # Every rank in its island, a rank that left no dump included (its rank file, its island's communicator).
    for r, name in (island_of(job) if job is not None else {}).items():
        if 0 <= r < n:
            col_island[r] = islands(name)
    for r, d in dumps.items():
        if not 0 <= r < n:
            continue
        phase = _phase_of(d.comms)
        col_phase[r], col_where[r] = phases(phase), frames(d.where)
        if col_host[r] < 0:
            col_host[r] = hosts(d.host)
        if col_state[r] < 0:
            col_state[r] = states("unknown")
    for r in range(n):
        if col_state[r] < 0:
            col_state[r] = states("no_dump" if job is not None and r not in dumps else "unknown")
    if any(i >= 0 for i in col_island):
        # Islands drawn as groups: the ring order inside each island, islands in order of appearance.
        first: dict[int, int] = {}
        for i, r in enumerate(order):
            first.setdefault(col_island[r], i)
        order = sorted(order, key=lambda r: first[col_island[r]])

    blamed = sorted({r for v in report.verdicts if v.kind.is_fault for r in v.ranks})
    advisory = sorted({r for v in report.verdicts if not v.kind.is_fault for r in v.ranks} - set(blamed))
    links = sorted({(s, d) for v in report.verdicts for s, d in v.links})
    blamed_links = [[s, d] for s, d in links]

    t0 = job.incident_time_ns if job is not None and job.incident_time_ns else None
    seq = _incident_seq(report, job, comm)
    timeline: list[dict[str, Any]] = []
    arrivals: list[Optional[float]] = []
    if t0 is not None and comm is not None:
        for r in _focus_ranks(order, blamed + advisory, blamed_links):
            rd = dumps.get(r)
            view = rd.comms.get(comm) if rd is not None else None
            recs: list[list[Any]] = []
            pos = None
            if view is not None:
                recs = [_rec_row(x, t0, False) for x in view.recent if x.started_ns]
                if view.in_flight is not None and view.in_flight.rec.started_ns:
                    f = view.in_flight.rec
                    recs = [x for x in recs if x[0] != (f.seq or f.p2p_seq)] + [_rec_row(f, t0, True)]
                pos = view.position()
            timeline.append({"rank": r, "dump": d is not None, "position": pos, "ops": recs})
        for d in dumps.values():
            view = d.comms.get(comm)
            rec = view.op_at(seq) if view is not None and seq else None
            arrivals.append(round((rec.started_ns - t0) / 1e6, 3) if rec is not None and rec.started_ns else None)

    link_rows: list[list[Any]] = []
    for r, d in sorted(dumps.items()):
        views = [d.comms[comm]] if comm in d.comms else list(d.comms.values())
        for view in views:
            for lk in view.links:
                link_rows.append([r, lk.peer, lk.transport, lk.bytes_sent, lk.busy_ns])

    data = report.to_dict()
    del data["ranks"]  # drawn from the columns below; the rest is as `--json` gives it
    return {
        "report": data,
        "world": world,
        "comm": comm,
        "seq": seq,
        "order": order,
        "strings": {"state": states.items, "host": hosts.items, "island": islands.items, "op": ops.items,
                    "where": frames.items, "phase": phases.items},
        "ranks": {"state": col_state, "host": col_host, "island": col_island, "op": col_op, "seq": col_seq,
                  "where": col_where, "phase": col_phase, "waiting": col_wait},
        "blamed": blamed,
        "advisory": advisory,
        "blamed_links": blamed_links,
        "timeline": timeline,
        "arrivals": arrivals,
        "links": link_rows,
    }
