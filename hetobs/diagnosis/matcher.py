"""Stage 2: match collectives per communicator by sequence id.

For each communicator: which op is stuck (the lowest sequence id some rank has been
waiting in for the stall time, or that failed), who never joined it and where they
are instead, who is behind, and whether the ranks agree on what the op is. Agreement
is decided by majority over the ranks' own records — never by trusting one rank
(the Flight Recorder analyzer's flaw is taking the first rank as the reference) —
and when no op has a majority the verdict says so and names every side.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import AbstractSet, Iterable, Optional

from .confidence import confidence, majority_confidence
from .job import LoadedJob
from .summary import CommView, OpSig
from .types import CommKey, Verdict, VerdictKind

__all__ = ["Stuck", "find_stuck", "mismatch_verdicts", "fold_consequences", "not_joined_verdict", "where_is", "few"]

_MAX_LINES = 8


def few(ranks: Iterable[int], limit: int = _MAX_LINES) -> str:
    rs = list(ranks)
    s = ", ".join(str(r) for r in rs[:limit])
    return s + (f" and {len(rs) - limit} more" if len(rs) > limit else "")


@dataclass
class Stuck:
    """One communicator's stuck (or failed) collective."""

    comm: CommKey
    seq: int
    op: Optional[str]
    members: tuple[int, ...]
    waiting: list[int] = field(default_factory=list)  # in the op, not moving for >= stall time
    joined: list[int] = field(default_factory=list)  # called the op (waiting, moving, failed or done)
    not_joined: list[int] = field(default_factory=list)  # alive, dumped, never called it
    positions: dict[int, Optional[int]] = field(default_factory=dict)  # of the not-joined ranks
    failed: list[int] = field(default_factory=list)
    waited_s: Optional[float] = None  # longest wait among the waiting ranks
    no_dump: list[int] = field(default_factory=list)


def _views(job: LoadedJob, comm: CommKey) -> tuple[tuple[int, ...], dict[int, Optional[CommView]]]:
    members = job.members.get(comm) or tuple(sorted(r for r, d in job.dumps.items() if comm in d.comms))
    views = {r: (job.dumps[r].comms.get(comm) if r in job.dumps else None) for r in members}
    return members, views


def _failed_seq(view: CommView) -> Optional[int]:
    if view.in_flight is not None and view.in_flight.rec.seq and (view.failed or view.in_flight.rec.state == "failed"):
        return view.in_flight.rec.seq
    for r in reversed(view.recent):
        if r.state == "failed" and r.seq:
            return r.seq
    return None


def find_stuck(job: LoadedJob, stall_s: float) -> list[Stuck]:
    """Every communicator whose lowest outstanding collective is stuck or failed."""
    comms = set(job.members)
    for d in job.dumps.values():
        comms.update(d.comms)
    out: list[Stuck] = []
    for comm in sorted(comms, key=str):
        members, views = _views(job, comm)
        stuck_seqs: list[int] = []
        waited: list[float] = []
        unknown_wait = False
        for v in views.values():
            if v is None:
                continue
            fs = _failed_seq(v) if v.failed or v.recent else None
            if fs is not None:
                stuck_seqs.append(fs)
            f = v.in_flight
            if f is None or not f.rec.seq:
                continue
            if v.waiting_s is None:
                unknown_wait = True
            elif v.waiting_s >= stall_s:
                stuck_seqs.append(f.rec.seq)
                waited.append(v.waiting_s)
        positions = {r: (v.position() if v is not None else 0) for r, v in views.items() if r in job.dumps}
        if not stuck_seqs and unknown_wait or (job.source == "flight_recorder" and not stuck_seqs):
            # Flight Recorder: no wait times. A comm is stuck where its ranks' positions differ.
            known = [p for p in positions.values() if p]
            if known and min(positions.values(), key=lambda p: p or 0) != max(known):
                stuck_seqs.append(max(known))
            elif known and all(v is not None and v.in_flight is not None and v.in_flight.rec.state == "started"
                               and v.in_flight.rec.seq == max(known) for v in views.values()):
                stuck_seqs.append(max(known))  # NCCL: every rank entered it and none completed it
        if not stuck_seqs:
            continue
        seq = min(stuck_seqs)
        st = Stuck(comm, seq, None, members, waited_s=max(waited) if waited else None)
        ops: Counter[Optional[str]] = Counter()
        for r in members:
            v = views.get(r)
            if r not in job.dumps:
                st.no_dump.append(r)
                continue
            rec = v.op_at(seq) if v is not None else None
            pos = positions.get(r) or 0
            if rec is not None or pos >= seq:
                st.joined.append(r)
                if rec is not None:
                    ops[rec.op] += 1
                    if rec.state == "failed" or (v is not None and v.failed and rec.seq == seq):
                        st.failed.append(r)
                    elif (v is not None and v.in_flight is not None and v.in_flight.rec.seq == seq
                          and (v.waiting_s is None or v.waiting_s >= stall_s)):
                        st.waiting.append(r)
            else:
                st.not_joined.append(r)
                st.positions[r] = pos or None
        st.op = ops.most_common(1)[0][0] if ops else None
        out.append(st)
    return out


def where_is(job: LoadedJob, rank: int, comm: CommKey) -> str:
    """Where a rank is instead of the stuck op: another op in flight, else its Python frame."""
    d = job.dumps.get(rank)
    if d is None:
        return "unknown (no dump)"
    if job.source == "flight_recorder":  # FR has no current stack: say where its last op came from
        return f"past its last recorded op (called from {d.where})" if d.where else "past its last recorded op"
    for c, v in d.comms.items():
        if c != comm and v.in_flight is not None:
            f = v.in_flight.rec
            what = f"in {f.op} seq {f.seq or f.p2p_seq} on comm {c}"
            if v.waiting_s is not None:
                what += f" (no progress for {v.waiting_s:.1f} s)"
            return what
    if d.where:
        return f"in Python: {d.where}"
    if d.python_status and d.python_status != "ok":
        return f"not in a collective (Python stacks: {d.python_status})"
    return "not in any collective"


def not_joined_verdict(job: LoadedJob, st: Stuck, ranks: list[int]) -> Verdict:
    conf = confidence(VerdictKind.RANK_NOT_JOINED, "native_records" if job.source == "hetobs" else "foreign_records")
    ev: list[str] = []
    if st.waiting and st.waited_s is not None:
        ev.append(f"rank(s) {few(st.waiting)} have waited for {st.waited_s:.1f} s in {st.op} seq {st.seq} "
                  f"on comm {st.comm}")
    elif st.waiting:
        ev.append(f"rank(s) {few(st.waiting)} entered {st.op} seq {st.seq} on comm {st.comm} and did not complete it"
                  f" (as recorded; Flight Recorder dumps carry no wait times)")
    elif st.joined:
        ev.append(f"rank(s) {few(st.joined)} called {st.op} seq {st.seq} on comm {st.comm}")
    for r in ranks[:_MAX_LINES]:
        pos = st.positions.get(r)
        behind = f"its last op on comm {st.comm} is seq {pos}" if pos else f"it has no op on comm {st.comm}"
        if pos and st.seq - pos > 1:
            behind += f", {st.seq - pos} behind"
        ev.append(f"rank {r} never called seq {st.seq}: {behind}; it is {where_is(job, r, st.comm)}")
    if len(ranks) > _MAX_LINES:
        ev.append(f"... and {len(ranks) - _MAX_LINES} more rank(s) likewise")
    if len(ranks) > len(st.joined) and st.joined:
        conf = confidence(VerdictKind.RANK_NOT_JOINED, "few_joined")
        ev.append(f"only {len(st.joined)} of {len(st.members)} ranks called seq {st.seq}: they may instead have "
                  f"issued a collective the others never will")
    summary = (f"rank {ranks[0]} never joined {st.op} seq {st.seq} on comm {st.comm}" if len(ranks) == 1 else
               f"ranks {few(ranks, 4)} never joined {st.op} seq {st.seq} on comm {st.comm}")
    return Verdict(VerdictKind.RANK_NOT_JOINED, sorted(ranks), summary, ev, comm=st.comm, seq=st.seq, op=st.op,
                   confidence=conf)


def _differs(a: OpSig, b: OpSig) -> str:
    parts = []
    for name in ("op", "dtype", "count", "root"):
        x, y = getattr(a, name), getattr(b, name)
        if x != y:
            parts.append(f"{name} {y} instead of {x}")
    return ", ".join(parts)


def mismatch_verdicts(job: LoadedJob, stuck: list[Stuck]) -> list[Verdict]:
    """The first sequence id per communicator where the ranks' ops disagree, judged by majority."""
    out: list[Verdict] = []
    stuck_by_comm = {s.comm: s for s in stuck}
    comms = set(job.members)
    for d in job.dumps.values():
        comms.update(d.comms)
    for comm in sorted(comms, key=str):
        members, _ = _views(job, comm)
        limit = stuck_by_comm[comm].seq if comm in stuck_by_comm else None
        # one pass over every rank's records: seq -> op signature -> ranks
        by_seq: dict[int, dict[OpSig, list[int]]] = {}
        for r in members:
            rd = job.dumps.get(r)
            v = rd.comms.get(comm) if rd is not None else None
            if v is None:
                continue
            mine: dict[int, OpSig] = {rec.seq: rec.sig for rec in v.recent if rec.seq}
            if v.in_flight is not None and v.in_flight.rec.seq:
                mine[v.in_flight.rec.seq] = v.in_flight.rec.sig
            for seq, sig in mine.items():
                if limit is None or seq <= limit:
                    by_seq.setdefault(seq, {}).setdefault(sig, []).append(r)
        for seq in sorted(by_seq):
            groups = by_seq[seq]
            if len(groups) >= 2:
                out.append(_mismatch(comm, seq, groups))
                break  # later pairings are unreliable after a desync
    return out


def _mismatch(comm: CommKey, seq: int, groups: dict[OpSig, list[int]]) -> Verdict:
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    top_sig, top = ranked[0]
    majority = len(top) > len(ranked[1][1])
    ev = [f"rank(s) {few(sorted(rs))} called {sig.text()} at seq {seq}" for sig, rs in ranked]
    if majority:
        deviants = sorted(r for _, rs in ranked[1:] for r in rs)
        for sig, rs in ranked[1:]:
            ev.append(f"rank(s) {few(sorted(rs))} differ from the majority ({len(top)} of "
                      f"{sum(len(x) for x in groups.values())} ranks): {_differs(top_sig, sig)}")
        share = len(top) / sum(len(x) for x in groups.values())
        conf = majority_confidence(share)
        summary = (f"rank{'s' if len(deviants) > 1 else ''} {few(deviants, 4)} called a different op at seq {seq} "
                   f"on comm {comm} than the majority ({top_sig.text()})")
        return Verdict(VerdictKind.OP_MISMATCH, deviants, summary, ev, comm=comm, seq=seq, op=top_sig.op,
                       confidence=conf)
    everyone = sorted(r for _, rs in ranked for r in rs)
    ev.append("no op has a majority: which side deviated cannot be told from the dumps")
    return Verdict(VerdictKind.OP_MISMATCH, everyone, f"ranks disagree on the op at seq {seq} on comm {comm} "
                   f"and no op has a majority", ev, comm=comm, seq=seq, op=None,
                   confidence=confidence(VerdictKind.OP_MISMATCH, "no_majority"))


def _signatures_at(job: LoadedJob, comm: CommKey, seq: int) -> dict[OpSig, list[int]]:
    """What each member with a dump called at `seq` on `comm`, grouped by signature."""
    members, views = _views(job, comm)
    out: dict[OpSig, list[int]] = {}
    for r in members:
        v = views.get(r)
        rec = v.op_at(seq) if v is not None else None
        if rec is not None:
            out.setdefault(rec.sig, []).append(r)
    return out


def _comm_name(job: LoadedJob, comm: CommKey) -> str:
    for d in job.dumps.values():
        v = d.comms.get(comm)
        if v is not None and v.name:
            return f"comm {comm} ({v.name})"
    return f"comm {comm}"


def fold_consequences(job: LoadedJob, verdicts: list[Verdict], min_confidence: float) -> list[Verdict]:
    """Mismatches that follow from deviants already named on another communicator, folded into that verdict.

    A rank that calls a different op in a hierarchical (islands) op calls it on its island's
    own library communicator too, so that communicator disagrees as well: with two ranks in
    the island there is no majority there and both would be named, the innocent one
    included. A disagreement is such a consequence when, once the named deviants are set
    aside, everyone else on that communicator agrees. The verdict on the largest
    communicator (the whole job's op) keeps the blame; the consequence becomes its evidence.
    """
    def size(v: Verdict) -> int:
        return len(job.members.get(v.comm, ())) if v.comm is not None else 0

    roots: list[Verdict] = []
    folded: set[int] = set()
    for v in sorted((v for v in verdicts if v.kind == VerdictKind.OP_MISMATCH), key=lambda v: -size(v)):
        if v.comm is None or v.seq is None:
            continue  # nothing to compare it with
        groups = _signatures_at(job, v.comm, v.seq)
        for root in roots:
            deviants = set(root.ranks)
            rest = {sig for sig, rs in groups.items() if set(rs) - deviants}
            if root.comm == v.comm or len(rest) > 1 or not any(deviants & set(rs) for rs in groups.values()):
                continue
            sides = "; ".join(f"rank(s) {few(sorted(rs))} called {sig.text()}" for sig, rs in groups.items())
            root.evidence.append(f"the disagreement that follows on {_comm_name(job, v.comm)} at seq {v.seq} "
                                 f"({sides}) is a consequence of it, not a second fault")
            folded.add(id(v))
            break
        else:
            if v.confidence >= min_confidence:
                roots.append(v)
    return [v for v in verdicts if id(v) not in folded]


def p2p_verdicts(job: LoadedJob, stall_s: float, blamed: set[int],
                 held: AbstractSet[int] = frozenset()) -> list[Verdict]:
    """Point-to-point ops stuck for the stall time whose peer has no matching op in flight.

    A peer that is itself held in a stuck collective elsewhere (`held`: e.g. a relay's
    peer inside its island's library, waiting on the real culprit) is a victim, not blamed.

    p2p ops carry no collective sequence id, so they are matched pairwise: rank A
    waiting in send/recv with peer P is matched when P has a p2p op with A in flight
    on the same communicator; otherwise P never joined, and the evidence says where
    P is instead. (The `peer` of an op record is a communicator rank, mapped to a
    global rank through the communicator's membership.)
    """
    waits: dict[int, list[tuple[int, CommKey, str, int, float]]] = {}  # peer -> [(waiter, comm, op, p2p seq, s)]
    for r, d in job.dumps.items():
        for comm, v in d.comms.items():
            f = v.in_flight
            if f is None or f.rec.seq or f.rec.peer is None or v.waiting_s is None or v.waiting_s < stall_s:
                continue
            members = job.members.get(comm) or v.members
            peer = members[f.rec.peer] if members and 0 <= f.rec.peer < len(members) else f.rec.peer
            pd = job.dumps.get(peer)
            pv = pd.comms.get(comm) if pd is not None else None
            if pv is not None and pv.in_flight is not None and not pv.in_flight.rec.seq:
                pm = job.members.get(comm) or pv.members
                back = pv.in_flight.rec.peer
                if back is not None and (pm[back] if pm and 0 <= back < len(pm) else back) == r:
                    continue  # matched: both sides are in the exchange
            if pd is None or peer in blamed or peer in held:
                continue  # no dump: stage 1 speaks for it; held elsewhere: the chain goes on there
            waits.setdefault(peer, []).append((r, comm, f.rec.op or "p2p", f.rec.p2p_seq, v.waiting_s))
    out = []
    for peer, ws in sorted(waits.items()):
        r, comm, op, p2p, secs = ws[0]
        ev = [f"rank {w} has waited {s:.1f} s in {o} with rank {peer} (p2p seq {q}) on comm {c}"
              for w, c, o, q, s in ws[:_MAX_LINES]]
        ev.append(f"rank {peer} has no matching op with them in flight; it is {where_is(job, peer, comm)}")
        out.append(Verdict(VerdictKind.RANK_NOT_JOINED, [peer], f"rank {peer} never joined the {op} rank {r} "
                           f"waits in (p2p seq {p2p}) on comm {comm}", ev, comm=comm, seq=None, op=op,
                           confidence=confidence(VerdictKind.RANK_NOT_JOINED, "p2p_peer")))
    return out
