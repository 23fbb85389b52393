"""Stage 4a: a cycle of waits across communicators -> `deadlock`.

Comm X is stuck waiting for ranks that never joined it; if those ranks are
themselves stuck in comm Y, X waits on Y. When the waits form a cycle (X waits on Y
while Y waits on X, or longer), nobody can move: a deadlock, typically two groups
calling collectives on two communicators in opposite orders. The edges come from the
wait-for graph (waits.py); a chain that merely ends somewhere is no deadlock: its end
is the culprit, named by the engine.
"""

from __future__ import annotations

from typing import Optional

from .confidence import confidence
from .matcher import few
from .types import CommKey, Verdict, VerdictKind
from .waits import WaitGraph

__all__ = ["find_deadlocks"]


def find_deadlocks(graph: WaitGraph) -> list[Verdict]:
    """Cycles of the wait-for graph that hold a comm stuck for the stall time."""
    edges = graph.edges
    out: list[Verdict] = []
    seen: set[frozenset[CommKey]] = set()
    for start in sorted(edges, key=str):
        cycle = _cycle_from(start, edges)
        if cycle is None or frozenset(cycle) in seen or not graph.strict.intersection(cycle):
            continue
        seen.add(frozenset(cycle))
        ranks: set[int] = set()
        ev = []
        for i, x in enumerate(cycle):
            y = cycle[(i + 1) % len(cycle)]
            rs = sorted(edges[x][y])
            ranks.update(rs)
            sx, sy = graph.nodes[x], graph.nodes[y]
            ev.append(f"comm {x} ({sx.op} seq {sx.seq}) waits for rank(s) {few(rs)}, which are stuck in comm {y} "
                      f"({sy.op} seq {sy.seq})")
        for c in cycle:  # comms that wait into the cycle from outside
            ev.extend(e for e in graph.chain_evidence(c, skip=set(cycle)) if e not in ev)
        summary = "deadlock: " + " -> ".join(f"comm {c}" for c in cycle + [cycle[0]]) + \
                  f" wait on each other (ranks {few(sorted(ranks), 6)})"
        first = graph.nodes[cycle[0]]
        out.append(Verdict(VerdictKind.DEADLOCK, sorted(ranks), summary, ev, comm=first.comm, seq=first.seq,
                           op=first.op, confidence=confidence(VerdictKind.DEADLOCK, "cycle")))
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
