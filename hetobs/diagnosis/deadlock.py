"""Stage 4a: a cycle of waits across communicators -> `deadlock`.

Comm X is stuck waiting for ranks that never joined it; if those ranks are
themselves stuck in comm Y, X waits on Y. When the waits form a cycle (X waits on Y
while Y waits on X, or longer), nobody can move: a deadlock, typically two groups
calling collectives on two communicators in opposite orders. The graph has one node
per stuck communicator, so it stays tiny at any world size.
"""

from __future__ import annotations

from typing import Optional

from .job import LoadedJob
from .matcher import Stuck, few
from .types import CommKey, Verdict, VerdictKind

__all__ = ["find_deadlocks"]


def find_deadlocks(job: LoadedJob, stuck: list[Stuck]) -> list[Verdict]:
    by_comm = {s.comm: s for s in stuck}
    # edges[X][Y] = ranks that comm X waits for and that are stuck in comm Y
    edges: dict[CommKey, dict[CommKey, list[int]]] = {}
    for s in stuck:
        for r in s.not_joined:
            d = job.dumps.get(r)
            if d is None:
                continue
            for c, v in d.comms.items():
                if c != s.comm and c in by_comm and v.in_flight is not None and r in by_comm[c].waiting + \
                        by_comm[c].joined:
                    edges.setdefault(s.comm, {}).setdefault(c, []).append(r)
    out: list[Verdict] = []
    seen: set[frozenset[CommKey]] = set()
    for start in sorted(edges, key=str):
        cycle = _cycle_from(start, edges)
        if cycle is None or frozenset(cycle) in seen:
            continue
        seen.add(frozenset(cycle))
        ranks: set[int] = set()
        ev = []
        for i, x in enumerate(cycle):
            y = cycle[(i + 1) % len(cycle)]
            rs = sorted(edges[x][y])
            ranks.update(rs)
            sx, sy = by_comm[x], by_comm[y]
            ev.append(f"comm {x} ({sx.op} seq {sx.seq}) waits for rank(s) {few(rs)}, which are stuck in comm {y} "
                      f"({sy.op} seq {sy.seq})")
        summary = "deadlock: " + " -> ".join(f"comm {c}" for c in cycle + [cycle[0]]) + \
                  f" wait on each other (ranks {few(sorted(ranks), 6)})"
        first = by_comm[cycle[0]]
        out.append(Verdict(VerdictKind.DEADLOCK, sorted(ranks), summary, ev, comm=first.comm, seq=first.seq,
                           op=first.op, confidence=0.9))
    return out


def _cycle_from(start: CommKey, edges: dict[CommKey, dict[CommKey, list[int]]]) -> Optional[list[CommKey]]:
    path: list[CommKey] = [start]
    on_path = {start}

    def dfs(node: CommKey) -> Optional[list[CommKey]]:
        for nxt in sorted(edges.get(node, {}), key=str):
            if nxt == start:
                return list(path)
            if nxt in on_path:
                continue
            path.append(nxt)
            on_path.add(nxt)
            found = dfs(nxt)
            if found:
                return found
            path.pop()
            on_path.discard(nxt)
        return None

    return dfs(start)
