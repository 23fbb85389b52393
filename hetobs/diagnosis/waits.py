"""The wait-for graph across communicators: who waits behind whom, to the end of the chain.

A rank that never joined comm X's stuck op may be held in an op of comm Y instead
(waiting in it, or failed in it): it is a victim, not a culprit, and X waits on Y.
Following these edges from every stuck communicator ends at ranks held nowhere —
asleep in Python, dead, stopped: the culprits — or in a cycle (deadlock.py). The
culprit is blamed once, on the communicator at the end of the longest chain (where
everything behind it piles up), and the evidence lists the chain.

Nodes are the stuck communicators of `find_stuck` (no progress for the stall time),
plus communicators a held rank is in flight in that have not waited that long yet:
ranks dump at slightly different moments, so the op a victim waits in may look
younger than the stall time; it still holds the victim. The graph has one node per
communicator, so it stays tiny at any world size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from .job import LoadedJob
from .matcher import Stuck, few, find_stuck
from .types import CommKey, Verdict

__all__ = ["WaitGraph", "build_wait_graph"]

_MAX_NAMED = 8  # ranks whose other absences are listed, per verdict


def _key(c: CommKey) -> str:
    return str(c)


@dataclass
class WaitGraph:
    """Edges X -> Y: comm X waits for ranks that are held in comm Y's op."""

    nodes: dict[CommKey, Stuck]
    strict: set[CommKey]  # stuck for the stall time (the others only hold a victim)
    edges: dict[CommKey, dict[CommKey, list[int]]] = field(default_factory=dict)
    held: dict[int, CommKey] = field(default_factory=dict)  # victim -> comm whose op holds it

    def is_victim(self, rank: int) -> bool:
        return rank in self.held

    def waiters(self, comm: CommKey) -> list[int]:
        st = self.nodes[comm]
        return sorted(set(st.waiting) | set(st.failed))

    def behind(self, comm: CommKey) -> set[int]:
        """Every rank that waits on `comm`, directly or through a chain of other comms."""
        out: set[int] = set()
        seen = {comm}
        todo = [comm]
        while todo:
            c = todo.pop()
            out.update(self.waiters(c))
            for x, ys in self.edges.items():
                if c in ys and x not in seen:
                    seen.add(x)
                    todo.append(x)
        return out

    def ends(self, ranks_of: Callable[[Stuck], list[int]]) -> dict[int, CommKey]:
        """Each rank `ranks_of` lists in a comm others wait in -> the comm whose chain behind it is
        longest (ties: no further waits, stuck for the stall time, lowest id). One pass: O(ranks)."""
        where: dict[int, list[CommKey]] = {}
        score: dict[CommKey, tuple[int, bool, bool]] = {}
        for c in sorted(self.nodes, key=_key):
            if not self.waiters(c):
                continue
            score[c] = (len(self.behind(c)), not self.edges.get(c), c in self.strict)
            for r in ranks_of(self.nodes[c]):
                where.setdefault(r, []).append(c)
        # max() keeps the first of equals: the lowest comm id
        return {r: max(cs, key=score.__getitem__) for r, cs in where.items()}

    def waiting_here(self, comm: CommKey) -> list[str]:
        """Who waits (or failed) in `comm`'s op: the first link of the chain, for verdicts that lack it."""
        st = self.nodes[comm]
        ev: list[str] = []
        if st.waiting:
            ev.append(f"rank(s) {few(sorted(st.waiting))} wait in {st.op} seq {st.seq} on comm {comm}"
                      + (f" (up to {st.waited_s:.1f} s)" if st.waited_s is not None else ""))
        if st.failed:
            ev.append(f"rank(s) {few(sorted(st.failed))} failed in {st.op} seq {st.seq} on comm {comm}")
        return ev

    def chain_evidence(self, comm: CommKey, skip: Optional[set[CommKey]] = None) -> list[str]:
        """Lines naming who waits behind `comm`, link by link, back to the start of each chain
        (never through the comms in `skip`)."""
        ev: list[str] = []
        seen = {comm} | (skip or set())
        todo = [comm]
        while todo:
            y = todo.pop(0)
            sy = self.nodes[y]
            for x in sorted(self.edges, key=_key):
                rs = self.edges[x].get(y)
                if not rs or x in seen:
                    continue
                seen.add(x)
                todo.append(x)
                sx = self.nodes[x]
                ev.append(f"behind it: rank(s) {few(self.waiters(x))} wait in {sx.op} seq {sx.seq} on comm {x} for "
                          f"rank(s) {few(sorted(rs))}, which are held in {sy.op} seq {sy.seq} on comm {y}")
        return ev

    def also_missing(self, rank: int, comm: CommKey) -> list[str]:
        """Lines for the other comms that wait for `rank` (it is missing from them too)."""
        ev: list[str] = []
        for c in sorted(self.nodes, key=_key):
            st = self.nodes[c]
            if c != comm and (rank in st.not_joined or rank in st.no_dump) and self.waiters(c):
                ev.append(f"rank {rank} is also missing from {st.op} seq {st.seq} on comm {c}, where rank(s) "
                          f"{few(self.waiters(c))} wait")
        return ev

    def annotate(self, v: Verdict, comm: CommKey) -> None:
        """Add the chain behind `comm` to a verdict that blames the ranks at its end."""
        lines = self.chain_evidence(comm)
        for r in v.ranks[:_MAX_NAMED]:
            lines.extend(self.also_missing(r, comm))
        v.evidence.extend(lines)
        behind = sorted(self.behind(comm) - set(v.ranks))
        if any(comm in ys for ys in self.edges.values()):
            v.summary += f"; rank(s) {few(behind, 6)} wait behind {'it' if len(v.ranks) == 1 else 'them'}"


class _Holds:
    """Per node, as sets: the ranks its op holds (waiting or failed in it) and those that joined it."""

    def __init__(self) -> None:
        self.held: dict[CommKey, set[int]] = {}
        self.joined: dict[CommKey, set[int]] = {}

    def of(self, st: Stuck) -> tuple[set[int], set[int]]:
        if st.comm not in self.held:
            self.held[st.comm] = set(st.waiting) | set(st.failed)
            self.joined[st.comm] = set(st.joined)
        return self.held[st.comm], self.joined[st.comm]


def _held_in(job: LoadedJob, rank: int, away_from: CommKey, nodes: dict[CommKey, Stuck],
             holds: _Holds) -> Optional[CommKey]:
    d = job.dumps.get(rank)
    if d is None:
        return None
    for c, v in sorted(d.comms.items(), key=lambda kv: _key(kv[0])):
        if c == away_from or c not in nodes:
            continue
        held, joined = holds.of(nodes[c])
        if rank in held or (v.in_flight is not None and v.in_flight.rec.seq and rank in joined):
            return c
    return None


def _wants_more(job: LoadedJob, st: Stuck, nodes: dict[CommKey, Stuck]) -> bool:
    """A not-joined rank of `st` is in flight in a collective of a comm that is no node yet."""
    for r in st.not_joined:
        d = job.dumps.get(r)
        if d is None:
            continue
        for c, v in d.comms.items():
            if c != st.comm and c not in nodes and v.in_flight is not None and v.in_flight.rec.seq:
                return True
    return False


def build_wait_graph(job: LoadedJob, stuck: list[Stuck]) -> WaitGraph:
    nodes = {s.comm: s for s in stuck}
    g = WaitGraph(nodes=dict(nodes), strict=set(nodes))
    if any(_wants_more(job, s, nodes) for s in stuck):
        for s in find_stuck(job, 0.0):  # any op in flight holds the ranks in it
            g.nodes.setdefault(s.comm, s)
    holds = _Holds()
    todo = [s.comm for s in stuck]
    reached = set(todo)
    while todo:  # breadth first from the stuck comms, so every reached comm's ranks are looked at
        x = todo.pop(0)
        for r in g.nodes[x].not_joined:
            y = _held_in(job, r, x, g.nodes, holds)
            if y is None:
                continue
            g.edges.setdefault(x, {}).setdefault(y, []).append(r)
            g.held.setdefault(r, y)
            if y not in reached:
                reached.add(y)
                todo.append(y)
    # A young op on a cycle is no proof of a deadlock (the dumps were taken at slightly
    # different moments): its ranks count as free again, as without the graph.
    for c in [c for c in g.nodes if c not in g.strict and _on_cycle(c, g.edges)]:
        for x in list(g.edges):
            for r in g.edges[x].pop(c, []):
                g.held.pop(r, None)
        g.edges.pop(c, None)
    keep = _reachable(g.strict, g.edges)
    g.nodes = {c: st for c, st in g.nodes.items() if c in keep}
    g.edges = {x: ys for x, ys in g.edges.items() if x in keep and ys}
    return g


def _reachable(start: set[CommKey], edges: dict[CommKey, dict[CommKey, list[int]]]) -> set[CommKey]:
    seen = set(start)
    todo = list(start)
    while todo:
        for y in edges.get(todo.pop(), {}):
            if y not in seen:
                seen.add(y)
                todo.append(y)
    return seen


def _on_cycle(c: CommKey, edges: dict[CommKey, dict[CommKey, list[int]]]) -> bool:
    return c in _reachable(set(edges.get(c, {})), edges)
