"""Whole hosts: when every rank of one host is dead or unresponsive, one verdict for the host.

A frozen host (every process stopped, the machine hung, its network cut) leaves all its ranks
without a dump and deaf to the side channel. Stage 1 judges each such rank on its own, which
reads as N unrelated faults; the cause is one host. Where every rank the job has on a host is
named by a `rank_dead` or `rank_unresponsive` verdict, those verdicts become one, naming the
host and all its ranks (kind `rank_unresponsive` unless every one of them is dead), so a person
or a scheduler sees one machine to take out (`exclude_hosts` lists it alone).

Hosts are told apart by the host key the ranks' metadata carries (boot id and network
namespace), so two containers or namespaces with one hostname are two hosts; the hostname
names it.
"""

from __future__ import annotations

from typing import Optional

from .job import LoadedJob
from .types import Verdict, VerdictKind

__all__ = ["merge_host_verdicts"]

_STAGE1 = (VerdictKind.RANK_DEAD, VerdictKind.RANK_UNRESPONSIVE)
_EVIDENCE_PER_RANK = 3


def _host_of(job: LoadedJob, rank: int) -> Optional[str]:
    m = job.metas.get(rank)
    return (m.host_key if m is not None else None) or job.host_of(rank)


def merge_host_verdicts(job: LoadedJob, verdicts: list[Verdict]) -> list[Verdict]:
    members: dict[str, list[int]] = {}
    for r in sorted(set(job.metas) | set(job.dumps)):
        h = _host_of(job, r)
        if h is not None:
            members.setdefault(h, []).append(r)
    single: dict[int, Verdict] = {v.ranks[0]: v for v in verdicts if v.kind in _STAGE1 and len(v.ranks) == 1}
    merged: dict[str, Verdict] = {}
    for h, ranks in members.items():
        if len(ranks) < 2 or not all(r in single for r in ranks):
            continue
        vs = [single[r] for r in ranks]
        name = job.host_of(ranks[0]) or h
        dead = all(v.kind == VerdictKind.RANK_DEAD for v in vs)
        how = "dead: every process of the job on it is gone" if dead else \
            "unresponsive: every rank on it answered no one and left no dump (stopped, hung or cut off)"
        evidence = [f"all {len(ranks)} ranks the job has on host {name} ({', '.join(map(str, ranks))}) are named "
                    f"below; no rank on it left a dump"]
        for v in vs:
            evidence.extend(v.evidence[:_EVIDENCE_PER_RANK])
        merged[h] = Verdict(VerdictKind.RANK_DEAD if dead else VerdictKind.RANK_UNRESPONSIVE, list(ranks),
                            f"host {name} is {how}", evidence, comm=vs[0].comm, seq=vs[0].seq, op=vs[0].op,
                            confidence=min(v.confidence for v in vs))
    if not merged:
        return verdicts
    out: list[Verdict] = []
    placed: set[str] = set()
    for v in verdicts:
        h = _host_of(job, v.ranks[0]) if v.kind in _STAGE1 and len(v.ranks) == 1 else None
        if h in merged:
            if h not in placed:
                out.append(merged[h])  # where its first rank's verdict stood
                placed.add(h)
            continue
        out.append(v)
    return out
