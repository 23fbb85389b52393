"""Which direction of a stalled link loses packets, from the kernel's view of both ends.

When host B -> A is blackholed, A's data to B stalls too: B receives it but B's acks
never reach A, so A's send window never opens again, and A (not B) is the one that
retransmits (a packet dropped in B's own OUTPUT chain is never sent, so B counts no
retransmit at all). Frame counters and retransmit counts alone therefore point both
ways, or the wrong way. What tells the directions apart is a byte count seen from both
ends of one TCP byte stream (`links[].tcp` in each dump): bytes the receiver took in
order (`bytes_received`, and acknowledged) against bytes the sender saw acknowledged
(`bytes_acked`). On a link that stalled (no progress for the stall time) the two agree
unless acknowledgements are lost: B holding `ACK_GAP_BYTES` or more of A's bytes that A
never saw acknowledged means B -> A loses packets, and A -> B delivers them.

So a stalled link (src, dst) whose receiver holds unacknowledged-by-the-sender bytes is
really dst -> src: the verdict is turned around, merged when dst -> src is already named,
and every kept verdict quotes the numbers. Without TCP state on both ends (shm, older
dumps) verdicts stay as the counters made them.
"""

from __future__ import annotations

from typing import Iterator, Optional

from .job import LoadedJob
from .summary import LinkStat, TcpHealth
from .types import CommKey, Verdict, VerdictKind

__all__ = ["orient_links", "links_to", "ACK_GAP_BYTES"]

# More than the SYN/FIN accounting offset between the two counters (a byte or two), less than one segment.
ACK_GAP_BYTES = 1024


def links_to(job: LoadedJob, rank: int, peer: int, comm: Optional[CommKey]) -> Iterator[LinkStat]:
    """`rank`'s links to `peer` in its dump: of communicator `comm` when it has it, else of every one."""
    d = job.dumps.get(rank)
    if d is None:
        return
    views = [d.comms[comm]] if comm is not None and comm in d.comms else list(d.comms.values())
    for v in views:
        yield from (lk for lk in v.links if lk.peer == peer)


def _tcp(job: LoadedJob, rank: int, peer: int, comm: Optional[CommKey]) -> Optional[TcpHealth]:
    return next((lk.tcp for lk in links_to(job, rank, peer, comm) if lk.tcp is not None), None)


def _ack_gap(job: LoadedJob, src: int, dst: int, comm: Optional[CommKey]) -> Optional[tuple[int, int, int]]:
    """(gap, bytes dst received from src, bytes src saw acknowledged) of the src -> dst byte stream."""
    at_src, at_dst = _tcp(job, src, dst, comm), _tcp(job, dst, src, comm)
    if at_src is None or at_dst is None or at_src.bytes_acked is None or at_dst.bytes_received is None:
        return None
    return at_dst.bytes_received - at_src.bytes_acked, at_dst.bytes_received, at_src.bytes_acked


def _silence(t: Optional[TcpHealth]) -> str:
    heard = t.ms_since_heard() if t is not None else None
    return f"{heard / 1e3:.1f} s" if heard is not None else "an unknown time"


def _lossy_evidence(job: LoadedJob, lossy: tuple[int, int], comm: Optional[CommKey]) -> list[str]:
    """Why `lossy` = (a, b) loses packets: b's view of a, a's retransmits, b's lost acks."""
    a, b = lossy
    at_a, at_b = _tcp(job, a, b, comm), _tcp(job, b, a, comm)
    ev = [f"TCP: rank {b} has heard nothing (data or ack) from rank {a} for {_silence(at_b)}"]
    gap = _ack_gap(job, b, a, comm)
    if gap is not None and gap[0] >= ACK_GAP_BYTES:
        ev.append(f"TCP: rank {a} received {gap[1]} bytes from rank {b} in order and acknowledged them, but rank {b} "
                  f"saw only {gap[2]} acknowledged: {gap[0]} bytes of acknowledgements from {a} to {b} were lost, "
                  f"so packets from {a} to {b} are lost and packets from {b} to {a} arrive")
    if at_a is not None:
        ev.append(f"TCP at rank {a}: {at_a.retransmits_total} segment(s) retransmitted, {at_a.unacked} "
                  f"unacknowledged, {at_a.lost} presumed lost")
    if at_b is not None and (at_b.retransmits_total or at_b.lost):
        ev.append(f"TCP at rank {b}: {at_b.retransmits_total} segment(s) retransmitted, {at_b.lost} presumed lost: "
                  f"its data arrives but the acknowledgements never come back")
    return ev


def orient_links(job: LoadedJob, verdicts: list[Verdict]) -> list[Verdict]:
    """`link_stalled` verdicts pointed at the direction that loses packets, one per direction."""
    out: list[Verdict] = []
    named: dict[tuple[Optional[CommKey], int, int], Verdict] = {}
    for v in verdicts:
        if v.kind != VerdictKind.LINK_STALLED or len(v.links) != 1:
            out.append(v)
            continue
        src, dst = v.links[0]
        fwd, back = _ack_gap(job, src, dst, v.comm), _ack_gap(job, dst, src, v.comm)
        flipped = fwd is not None and fwd[0] >= ACK_GAP_BYTES and (back is None or back[0] < ACK_GAP_BYTES)
        if flipped:
            # dst holds src's bytes that src never saw acknowledged: dst -> src is what loses packets.
            v.links = [(dst, src)]
            v.summary = f"link {dst} -> {src} loses packets: what rank {dst} sends never reaches rank {src}"
            v.evidence = [f"the {src} -> {dst} stall is a consequence: rank {src}'s data waits for "
                          f"acknowledgements from rank {dst} that never arrive"] + v.evidence
        if fwd is not None or back is not None:
            v.evidence = _lossy_evidence(job, v.links[0], v.comm) + v.evidence
        key = (v.comm, *v.links[0])
        if key in named:
            named[key].evidence.extend(e for e in v.evidence if e not in named[key].evidence)
            continue
        named[key] = v
        out.append(v)
    return out
