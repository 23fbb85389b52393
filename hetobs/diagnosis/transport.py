"""Links that broke between two live ranks: one `transport_error` verdict per link, no rank blamed.

A rank reports a link it could not re-make first-hand, in one of two ways (docs/reconnect.md):
a `transport` failure ("link ... is down", a reset with reconnect off, a protocol error), or
a peer it found "gone" because the peer's listener refused every dial for 1.5 s. Refusal cannot
tell a dead process from a firewall that resets: when the "gone" peer left a dump of the same
incident it was alive, so the refusals came from the network and the link is to blame.

Direction (`links`: [[src, dst]]) comes from the reconnect record each end keeps of the link
(`links[].reconnect`): an end whose dials or probes toward its peer were refused (the event's
`errno` ECONNREFUSED; its sentence in dumps written before that field) while the peer had not
failed yet (after that its process may be gone and refuse for that reason) had
its packets to that peer answered with resets, so src -> dst is a direction that loses packets.
Both ends refused: both directions. Neither refused: every attempt went unanswered, which a
path dropping (or resetting, when the resets are dropped too) packets in either one direction
or both produces alike; the link is named in both directions and the summary says the direction
is unknown. Without records (older dumps): the reporting end and its peer, as before.
"""

from __future__ import annotations

import errno
from typing import Optional

from .causes import GONE_CLAIM, Cause, CauseKind
from .confidence import confidence
from .direction import links_to
from .job import LoadedJob
from .summary import CommView, LinkReconnect, ReconnectEvent
from .types import CommKey, Verdict, VerdictKind

__all__ = ["transport_verdicts", "GONE_CLAIM"]

# Dumps whose reconnect events predate their `stage`/`errno` fields say "refused" only in words:
_REFUSED = "refused"  # "Connection refused" / "refuses connections" in an attempt's error
_THROUGHOUT = "refused throughout"  # connect_retry.cc: every attempt of the refusal window was refused
_REFUSED_WINDOW_S = 1.5  # reconnect.cc kRefusedForNs: how long refusals last before a peer counts as gone
_EVENTS_QUOTED = 3


def _failed_view(job: LoadedJob, rank: int) -> Optional[CommView]:
    d = job.dumps.get(rank)
    if d is None:
        return None
    return next((v for v in d.comms.values() if v.failed), None)


def _record(job: LoadedJob, rank: int, peer: int, comm: Optional[CommKey]) -> Optional[LinkReconnect]:
    return next((lk.reconnect for lk in links_to(job, rank, peer, comm) if lk.reconnect is not None), None)


def _refused(rec: Optional[LinkReconnect], peer_failed_ns: Optional[int]) -> bool:
    """Whether this end's attempts to re-make the link met resets (its packets toward the peer died)
    while the peer still lived: once the peer has failed its process may have exited, and its
    host then refuses for that reason (both ends' records would point both ways). An event is
    written when the attempts end; its refusals began `refused_ns` before that."""
    if rec is None:
        return False
    for ev in rec.events:
        refused, began = _refusal(ev)
        if refused and (peer_failed_ns is None or began is None or began < peer_failed_ns):
            return True
    return False


def _refusal(ev: ReconnectEvent) -> tuple[bool, Optional[int]]:
    """Whether an attempt met refusals, and when they began (wall ns; None if not known).

    The event's fields where the dump has them; else (older dumps) its sentence: "refused
    throughout" attempts began the refusal window (reconnect.cc kRefusedForNs) before the
    event, others are placed at it."""
    t = ev.time_ns
    if ev.has_fields():
        if ev.stage == "broke" or ev.errno != errno.ECONNREFUSED:
            return False, None
        return True, (t - ev.refused_ns if t is not None else None)
    if _REFUSED not in ev.what or ev.what.startswith("broke"):
        return False, None
    return True, (t - int(_REFUSED_WINDOW_S * 1e9) if t is not None and _THROUGHOUT in ev.what else t)


def _failed_at(job: LoadedJob, rank: int) -> Optional[int]:
    """When `rank` failed: its error dump's time (written as it failed); None if it did not fail."""
    d = job.dumps.get(rank)
    return d.time_ns if d is not None and d.reason == "error" else None


def _quote(rank: int, peer: int, rec: Optional[LinkReconnect]) -> list[str]:
    if rec is None:
        return [f"rank {rank} kept no reconnect record of its link to rank {peer} (an older dump, or "
                f"HETOBS_RECONNECT_TIMEOUT=0)"]
    out = [f"rank {rank}'s link to rank {peer}: broke {rec.breaks} time(s), {rec.attempts} attempt(s) to "
           f"re-make it, ended {rec.state or 'unknown'}"]
    out += [f"rank {rank}: {_describe(ev)}" for ev in rec.events[-_EVENTS_QUOTED:]]
    return out


def _describe(ev: ReconnectEvent) -> str:
    """The event's sentence; from its fields when a dump's text was left out."""
    if ev.what or not ev.has_fields():
        return ev.what
    out = f"{ev.stage}: {errno.errorcode.get(ev.errno, str(ev.errno))}" if ev.errno else str(ev.stage)
    return out + (f" (refused for {ev.refused_ns / 1e9:.1f} s)" if ev.refused_ns else "")


def _is_report(c: Cause) -> bool:
    """A first-hand report that names a link: a transport failure, or a peer called gone."""
    if c.messengers:
        return False  # forwarded news names no link of the forwarding rank
    return c.kind is CauseKind.TRANSPORT or (c.kind is CauseKind.PEER_CLOSED and c.says_gone())


def transport_verdicts(job: LoadedJob, causes: dict[int, Cause], blamed: set[int]) -> list[Verdict]:
    out: list[Verdict] = []
    seen: set[tuple[int, int]] = set()
    for r, c in sorted(causes.items()):
        if not _is_report(c):
            continue
        for peer in c.culprits:
            if peer == r or peer in blamed or r in blamed or peer not in job.dumps:
                continue  # a peer without a dump may really be gone: reachability judges it
            theirs = causes.get(peer)
            if theirs is not None and theirs.kind not in (CauseKind.TRANSPORT, CauseKind.OTHER, CauseKind.PEER_CLOSED):
                continue  # the peer failed for its own reason first
            pair = (min(r, peer), max(r, peer))
            if pair in seen:
                continue
            seen.add(pair)
            out.append(_verdict(job, r, peer, c, theirs))
    return out


def _verdict(job: LoadedJob, r: int, peer: int, c: Cause, theirs: Optional[Cause]) -> Verdict:
    view = _failed_view(job, r)
    comm = view.comm if view is not None else None
    mine, other = _record(job, r, peer, comm), _record(job, peer, r, comm)
    fwd, back = _refused(mine, _failed_at(job, peer)), _refused(other, _failed_at(job, r))
    if fwd and back:
        links, way = [(r, peer), (peer, r)], "in both directions (each end's attempts were refused)"
    elif back:
        links, way = [(peer, r)], f"packets from rank {peer} to rank {r} are answered with resets"
    elif fwd:
        links, way = [(r, peer)], f"packets from rank {r} to rank {peer} are answered with resets"
    elif mine is not None and other is not None:
        # Silence both ways: a blackhole in one direction looks the same from both ends (one
        # end's SYN is lost, the other's answer is), so the link is named in both directions.
        links, way = [(r, peer), (peer, r)], ("no attempt in either direction was answered, so which direction "
                                               "loses packets cannot be told from the ends")
    else:
        links, way = [(r, peer)], "the ends kept no reconnect records to tell the direction by"
    evidence = [f"rank {r} reported: {c.text()}"]
    if theirs is not None:
        evidence.append(f"rank {peer} reported: {theirs.text()}")
    evidence.append(f"rank {peer} left a dump of this incident: it was alive, so the link failed, not the rank")
    evidence += _quote(r, peer, mine) + _quote(peer, r, other)
    return Verdict(VerdictKind.TRANSPORT_ERROR, [],
                   f"the link between ranks {r} and {peer} broke and could not be re-made while both were alive: {way}",
                   evidence, links=links, comm=comm, seq=c.seq, op=c.op,
                   confidence=confidence(VerdictKind.TRANSPORT_ERROR, "link_broke_both_alive"))
