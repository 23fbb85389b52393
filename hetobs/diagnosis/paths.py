"""A host cut off by the network is the path's fault, not its ranks'.

When the path between two hosts drops packets, neither side's side-channel requests
reach the other and the far side's dumps are late or never seen (its own requests fail
the same way), so stage 1 alone would take every rank over there for unresponsive. What
tells a cut path from failed ranks is the kernel's view of the data connections
(`links[].tcp` in the dumps of the ranks that did dump): a process that dies closes its
connections, and a stopped one's kernel still acknowledges what it is sent; only a path
that loses packets leaves data unacknowledged and retransmitted.

So when no rank of a host left a dump or answered anyone, and the data a live rank sent
to ranks there sits unacknowledged and retransmitted, the verdict is the path, one
`link_stalled` per pair of hosts, never the ranks. Its direction is the one that loses
packets, seen from the near host's ranks:
- they still heard the far host after their op stalled (its retransmissions arrive: the
  last packet from some far rank is younger than `HEARD_SHARE` of the stall) yet their
  own data is not acknowledged: what they send is lost, near -> far;
- they have heard nothing from the far host since their op stalled: what it sends is
  lost, far -> near (whether near -> far also loses cannot be told from this side).
The whole host pair is judged at once: one connection alone may be between two of the
far end's retransmissions, which back off exponentially. Hosts are told apart by the
rank files' `host_key` (boot id and network namespace), not by host name, which
namespaces and containers repeat.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from .confidence import confidence
from .job import LoadedJob
from .loader import rank_ranges
from .reach import Reach
from .summary import TcpHealth
from .types import CommKey, Verdict, VerdictKind

__all__ = ["path_verdicts", "HEARD_SHARE", "HEARD_MS"]

# Heard from the far end within this share of the time the op has stalled: it was heard after
# the stall began (retransmissions back off by doubling, so the last one is at most about half
# the stall old), so the path toward the near end works. A dump that lacks the stall time
# compares with HEARD_MS instead.
HEARD_SHARE = 0.8
HEARD_MS = 1000
_MAX_PAIRS = 8  # TCP lines quoted per verdict


class _Pair(NamedTuple):
    near: int
    far: int
    comm: CommKey
    tcp: TcpHealth
    stall_s: Optional[float]  # how long the near rank's op on that comm has not moved

    def heard_after_stall(self) -> bool:
        heard = self.tcp.ms_since_heard()
        if heard is None:
            return False
        return heard < (HEARD_SHARE * self.stall_s * 1e3 if self.stall_s else HEARD_MS)


def _host(job: LoadedJob, rank: int) -> Optional[str]:
    m = job.metas.get(rank)
    if m is not None and (m.host_key or m.host):
        return m.host_key or m.host
    return job.host_of(rank)


def _lossy(t: TcpHealth) -> bool:
    """Data waits for acknowledgement and is retransmitted (or presumed lost)."""
    return bool(t.unacked) and bool(t.retransmits_total or t.retransmitting or t.lost)


def path_verdicts(job: LoadedJob, reach: dict[int, Reach]) -> tuple[list[Verdict], set[int]]:
    """Verdicts on the paths to hosts no rank of which dumped or answered, and the ranks they clear."""
    # Only ranks this host cannot check ("unknown"): one on this host that does not answer is not cut off by
    # the network between hosts, and its process state speaks for it (stage 1).
    silent = {r for r, rc in reach.items() if rc.state == "unknown" and not rc.answered_by
              and (rc.unanswered_by or rc.unanswered_here)}
    if not silent:
        return [], set()
    hosts: dict[str, list[int]] = {}
    for r in range(job.world_size or 0):
        h = _host(job, r)
        if h is not None:
            hosts.setdefault(h, []).append(r)
    # Some rank of a host dumped or answered: it is reachable, and its silent ranks are judged one by one.
    far_host = {r: h for h, ranks in hosts.items() if set(ranks) <= silent for r in ranks}
    found: dict[tuple[str, str], dict[tuple[int, int], _Pair]] = {}  # (far host, near host) -> pairs
    for near, d in sorted(job.dumps.items()):
        near_host = _host(job, near)
        for comm, v in d.comms.items():
            for lk in v.links:
                far, t = lk.peer, lk.tcp
                if far not in far_host or near_host in (None, far_host[far]) or t is None or not _lossy(t):
                    continue
                stall = v.waiting_s if v.in_flight is not None else None
                pairs = found.setdefault((far_host[far], str(near_host)), {})
                pairs.setdefault((near, far), _Pair(near, far, comm, t, stall))
    out: list[Verdict] = []
    cleared: set[int] = set()
    for (far_host_name, _), by_pair in sorted(found.items()):
        cleared.update(hosts[far_host_name])
        ps = list(by_pair.values())
        out.append(_verdict(job, reach, hosts[far_host_name], ps, any(p.heard_after_stall() for p in ps)))
    return out, cleared


def _verdict(job: LoadedJob, reach: dict[int, Reach], far_ranks: list[int], pairs: list[_Pair],
             outward: bool) -> Verdict:
    nears = sorted({p.near for p in pairs})
    links = sorted({(p.near, p.far) if outward else (p.far, p.near) for p in pairs})
    where = job.host_of(far_ranks[0]) or "?"
    ev = [f"no rank on host {where} (rank(s) {rank_ranges(far_ranks)}) left a dump or answered a side-channel "
          f"request"]
    asked = sorted({x for f in far_ranks for x in reach[f].unanswered_by})
    if asked:
        ev.append(f"rank(s) {rank_ranges(asked)} asked them for dumps and got no answer")
    here = [f for f in far_ranks if reach[f].unanswered_here]
    if here:
        ev.append(f"this diagnosis asked rank(s) {rank_ranges(here)} for an on-demand dump and got no answer")
    for p in pairs[:_MAX_PAIRS]:
        t, heard = p.tcp, p.tcp.ms_since_heard()
        last = f"last heard from it {heard / 1e3:.1f} s ago" if heard is not None else "never heard from it"
        stall = f", its op there stalled {p.stall_s:.1f} s" if p.stall_s is not None else ""
        ev.append(f"TCP at rank {p.near} toward rank {p.far} (comm {p.comm}): {t.retransmits_total} segment(s) "
                  f"retransmitted, {t.unacked} unacknowledged, {t.lost} presumed lost; {last}{stall}")
    if len(pairs) > _MAX_PAIRS:
        ev.append(f"... and {len(pairs) - _MAX_PAIRS} more connection(s) likewise")
    ev.append("a dead process closes its connections and a stopped one's kernel still acknowledges data: data left "
              "unacknowledged and retransmitted is lost on the path (a host down as a whole looks the same from here)")
    if outward:
        ev.append(f"rank(s) {rank_ranges(nears)} still heard host {where} after their op stalled but their own data "
                  f"is never acknowledged: packets toward host {where} are lost")
        summary = (f"the path from rank(s) {rank_ranges(nears)} to rank(s) {rank_ranges(far_ranks)} (host {where}) "
                   f"loses packets: those ranks are cut off, not failed")
    else:
        ev.append(f"rank(s) {rank_ranges(nears)} have heard nothing from host {where} since their op stalled: "
                  f"packets from host {where} are lost (whether the other way loses too cannot be told from this "
                  f"side)")
        summary = (f"the path from rank(s) {rank_ranges(far_ranks)} (host {where}) to rank(s) {rank_ranges(nears)} "
                   f"loses packets: those ranks are cut off, not failed")
    return Verdict(VerdictKind.LINK_STALLED, [], summary, ev, links=links, comm=pairs[0].comm,
                   confidence=confidence(VerdictKind.LINK_STALLED, "host_path"))
