"""Stage 3: inside a collective every rank joined, walk the progress counters to where data stopped.

Each in-flight op carries per-peer frame counters (dump-schema.md): `send.sent` to a
peer and that peer's `recv.received` from us describe the same edge from both ends.
- sender sent more than the receiver received, and neither end has moved for the
  stall time -> the frames are stuck on the wire: `link_stalled` (src, dst);
  (a gap alone is normal in flight, so the stall time is required);
- along the ring (`ring[i]` sends to `ring[i+1]`), a rank whose incoming and outgoing
  edges are both clean, that received at least as many frames as it sent on and has
  not finished -> it holds data it never forwarded: `rank_stalled`.
"""

from __future__ import annotations

from typing import Optional

from .confidence import confidence
from .job import LoadedJob
from .matcher import Stuck
from .summary import InFlight, PeerProg
from .types import Verdict, VerdictKind

__all__ = ["walk"]


def _stale(p: Optional[PeerProg], stall_s: float) -> bool:
    return p is None or p.since_change_s is None or p.since_change_s >= stall_s


def _finished(p: PeerProg) -> bool:
    send_ok = p.send_posted is not None and p.send_done is not None and p.send_done >= p.send_posted
    recv_ok = p.recv_posted is not None and p.recv_done is not None and p.recv_done >= p.recv_posted
    return send_ok and recv_ok


def _link_evidence(job: LoadedJob, st: Stuck, src: int, dst: int) -> list[str]:
    """The cumulative byte counters of the link, from both ends, and where it runs."""
    ev = []
    sd, dd = job.dumps.get(src), job.dumps.get(dst)
    sv = sd.comms.get(st.comm) if sd is not None else None
    dv = dd.comms.get(st.comm) if dd is not None else None
    out_link = next((lk for lk in sv.links if lk.peer == dst), None) if sv is not None else None
    in_link = next((lk for lk in dv.links if lk.peer == src), None) if dv is not None else None
    if out_link is not None and in_link is not None and out_link.bytes_sent is not None \
            and in_link.bytes_recv is not None:
        gap = out_link.bytes_sent - in_link.bytes_recv
        ev.append(f"link counters: rank {src} sent {out_link.bytes_sent} bytes to rank {dst}, which received "
                  f"{in_link.bytes_recv} from it" + (f" ({gap} bytes never arrived)" if gap > 0 else ""))
    hs, hd = job.host_of(src), job.host_of(dst)
    if hs or hd:
        ev.append(f"link {hs}:{src} -> {hd}:{dst}")
    return ev


def _moved_on(job: LoadedJob, st: Stuck, ops: dict[int, InFlight], stall_s: float,
              known: set[tuple[int, int]]) -> list[Verdict]:
    """Senders that completed the stuck op (they are in a later one) while a receiver still waits for
    their frames: the frames were sent and never arrived. The sender's own counters of that op are
    gone (they reset per op), so the receiver's `recv` counters are the evidence."""
    out: list[Verdict] = []
    for dst, f in sorted(ops.items()):
        for p in f.peers:
            src = p.peer
            if src in ops or (src, dst) in known or p.recv_posted is None or p.received is None:
                continue
            if p.received >= p.recv_posted or not _stale(p, stall_s):
                continue
            sd = job.dumps.get(src)
            sv = sd.comms.get(st.comm) if sd is not None else None
            pos = sv.position() if sv is not None else None
            if pos is None or pos <= st.seq:
                continue
            ev = [f"rank {src} completed {st.op} seq {st.seq} on comm {st.comm} (it is at seq {pos} now), but rank "
                  f"{dst} received only {p.received} of the {p.recv_posted} frame(s) it expects from rank {src} in it",
                  f"rank {dst} has not received anything from rank {src} for "
                  f"{p.since_change_s if p.since_change_s is not None else float('nan'):.1f} s "
                  f"(stall time {stall_s:.1f} s); transport {p.transport or 'unknown'}"]
            nxt = sv.in_flight if sv is not None else None
            back = nxt.peer(dst) if nxt is not None else None
            if nxt is not None and back is not None and back.sent is not None and back.acked is not None \
                    and back.sent > back.acked:
                ev.append(f"in seq {nxt.rec.seq} rank {src} sent {back.sent} frame(s) to rank {dst} "
                          f"and {back.acked} were acknowledged")
            ev.extend(_link_evidence(job, st, src, dst))
            out.append(Verdict(VerdictKind.LINK_STALLED, [], f"link {src} -> {dst} stalled: frames rank {src} sent in "
                               f"{st.op} seq {st.seq} never reached rank {dst}", ev, links=[(src, dst)],
                               comm=st.comm, seq=st.seq, op=st.op,
                               confidence=confidence(VerdictKind.LINK_STALLED, "sender_moved_on")))
            known.add((src, dst))
    return out


def walk(job: LoadedJob, st: Stuck, stall_s: float) -> list[Verdict]:
    ops: dict[int, InFlight] = {}
    for r in st.joined:
        d = job.dumps.get(r)
        v = d.comms.get(st.comm) if d is not None else None
        if v is not None and v.in_flight is not None and v.in_flight.rec.seq == st.seq:
            ops[r] = v.in_flight
    out: list[Verdict] = []
    for src, f in sorted(ops.items()):
        for p in f.peers:
            dst = p.peer
            back = ops[dst].peer(src) if dst in ops else None
            if p.sent is None or back is None or back.received is None or p.sent <= back.received:
                continue
            if back.recv_posted is not None and back.recv_done is not None and back.recv_done >= back.recv_posted:
                continue  # dst has not asked for those frames yet: it is held up elsewhere, not by this link
            if not (_stale(p, stall_s) and _stale(back, stall_s)):
                continue
            quiet = min(x for x in (p.since_change_s, back.since_change_s, 1e18) if x is not None)
            ev = [f"rank {src} sent {p.sent} frame(s) to rank {dst} (acked {p.acked}), rank {dst} received "
                  f"{back.received} from rank {src}, in {st.op} seq {st.seq} on comm {st.comm}",
                  f"neither end moved for {quiet:.1f} s"
                  f" (stall time {stall_s:.1f} s); transport {p.transport or back.transport or 'unknown'}"]
            ev.extend(_link_evidence(job, st, src, dst))
            out.append(Verdict(VerdictKind.LINK_STALLED, [], f"link {src} -> {dst} stalled: frames sent were never "
                               f"received", ev, links=[(src, dst)], comm=st.comm, seq=st.seq, op=st.op,
                               confidence=confidence(VerdictKind.LINK_STALLED, "sent_not_received")))
    out.extend(_moved_on(job, st, ops, stall_s, {(a, b) for v in out for a, b in v.links}))
    if out:
        return out
    ring = job.rings.get(st.comm)
    if not ring or len(ring) < 2 or any(r not in ops for r in ring):
        return out
    if any(ops[r].algorithm not in (None, "ring") for r in ring):
        return out  # direct exchange or a chain: the ring walk does not describe its data flow
    n = len(ring)
    cands: list[tuple[int, list[str]]] = []
    for i, r in enumerate(ring):
        prev, nxt = ring[i - 1], ring[(i + 1) % n]
        me = ops[r]
        inp, outp = me.peer(prev), me.peer(nxt)
        prev_out = ops[prev].peer(r)
        nxt_in = ops[nxt].peer(r)
        if None in (inp, outp, prev_out, nxt_in):
            continue
        assert inp and outp and prev_out and nxt_in
        if None in (inp.received, outp.sent, prev_out.sent, nxt_in.received):
            continue
        in_clean = prev_out.sent == inp.received
        out_clean = outp.sent == nxt_in.received
        if not (in_clean and out_clean and inp.received and outp.sent is not None and inp.received >= outp.sent):
            continue
        if _finished(outp) or not _stale(outp, stall_s):
            continue
        cands.append((r, [f"rank {r} received {inp.received} frame(s) from rank {prev} (all rank {prev} sent) but "
                          f"sent only {outp.sent} on to rank {nxt} (rank {nxt} received all of them)",
                          f"no progress on rank {r}'s send to rank {nxt} for "
                          f"{outp.since_change_s if outp.since_change_s is not None else float('nan'):.1f} s"]))
    if cands and len(cands) <= max(1, n // 4):
        for r, ev in cands:
            out.append(Verdict(VerdictKind.RANK_STALLED, [r], f"rank {r} stalled inside {st.op} seq {st.seq}: it "
                               f"received data it never sent on", ev, comm=st.comm, seq=st.seq, op=st.op,
                               confidence=confidence(VerdictKind.RANK_STALLED,
                                                     "one_candidate" if len(cands) == 1 else "several_candidates")))
    return out
