"""Islands in a diagnosis: each rank's island, what its island's library was doing, and
where relayed data stopped.

A job on "hetobs_islands" runs every op in three places: the island's own library
(Gloo, NCCL, ...; its communicator named "<backend>:island:<name>"), the host relay
between islands (native op "relay", with chunk counters per stage), and the hierarchical
op that holds both. The stages before this one find the culprit; this one says, in its
terms, which island it is in, which members of that island wait on it inside their
library (what the vendor wrapper recorded), and for a relay link whether the data
stopped in a device copy or on the wire.
"""

from __future__ import annotations

from typing import Optional

from .confidence import confidence
from .job import LoadedJob
from .summary import CommView, RelayPeer
from .types import CommKey, Verdict, VerdictKind

__all__ = ["island_of", "annotate", "relay_link_verdicts"]

_VENDORS = ("gloo", "nccl", "mpi", "vendor")  # "vendor": HCCL, XCCL, ... (named in the comm name)


def island_of(job: LoadedJob) -> dict[int, str]:
    """rank -> island, from dumps, rank files and the islands' own communicators.

    A rank that left no dump still has its island: its rank file names it, and where that
    is missing too, the membership of its island's library communicator (comms/comm-*.json,
    named "<library>:island:<name>" by the ranks that dumped) places it.
    """
    out: dict[int, str] = {}
    for comm, island in _library_comms(job).items():
        for r in job.members.get(comm, ()):
            out[r] = island
    out.update((r, m.island) for r, m in job.metas.items() if m.island)
    for r, d in job.dumps.items():
        for v in d.comms.values():
            name = v.island or _rec_island(v)
            if name:
                out[r] = name
                break
    return out


def _library_comms(job: LoadedJob) -> dict[CommKey, str]:
    """comm -> island, for each island library communicator a dump names ("gloo:island:a")."""
    out: dict[CommKey, str] = {}
    for d in job.dumps.values():
        for c, v in d.comms.items():
            parts = v.name.split(":") if v.name and c not in out else ()
            if len(parts) == 3 and parts[1] == "island" and parts[2]:
                out[c] = parts[2]
    return out


def _rec_island(v: CommView) -> Optional[str]:
    if v.in_flight is not None and v.in_flight.rec.island:
        return v.in_flight.rec.island
    return next((x.island for x in reversed(v.recent) if x.island), None)


def annotate(verdicts: list[Verdict], job: LoadedJob) -> None:
    """Name the islands of every verdict's ranks and links; add the island evidence."""
    islands = island_of(job)
    if not islands:
        return
    for v in verdicts:
        named = sorted(set(v.ranks) | {r for link in v.links for r in link})
        v.islands = {r: islands[r] for r in named if r in islands}
        if v.ranks and v.islands:
            groups: dict[str, list[int]] = {}
            for r in v.ranks:
                if r in islands:
                    groups.setdefault(islands[r], []).append(r)
            v.summary += " (" + "; ".join(f"island {i}: rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}"
                                          for i, rs in groups.items()) + ")"
            for r in v.ranks:
                v.evidence.extend(_vendor_waits(job, islands, r))
        for src, dst in v.links:
            a, b = islands.get(src), islands.get(dst)
            if a and b and a != b:
                v.evidence.append(f"link {src} -> {dst} crosses islands ({a} -> {b}): the host relay")
                where = _relay_stop(job, src, dst) or _wire_stop(job, src, dst)
                if where:
                    v.evidence.append(where)


def _vendor_waits(job: LoadedJob, islands: dict[int, str], culprit: int) -> list[str]:
    """Members of the culprit's island held inside their island's library at the incident."""
    out = []
    for r, d in sorted(job.dumps.items()):
        if r == culprit or islands.get(r) != islands.get(culprit):
            continue
        for v in d.comms.values():
            f = v.in_flight
            if f is None or v.backend not in _VENDORS or v.members is None or culprit not in v.members:
                continue
            held = f" for {f.seconds_in_op:.1f} s" if f.seconds_in_op is not None else ""
            library = v.name.split(":", 1)[0] if v.name else v.backend
            out.append(f"rank {r} (island {islands[r]}) waits inside {v.name or v.backend}: {f.rec.op} seq "
                       f"{f.rec.seq}{held}, the island's {library} op that rank {culprit} is also in")
    return out


def _relay_peer(job: LoadedJob, rank: int, peer: int) -> Optional[RelayPeer]:
    d = job.dumps.get(rank)
    for v in d.comms.values() if d else ():
        f = v.in_flight
        for p in f.relay if f is not None else ():
            if p.peer == peer:
                return p
    return None


def _relay_stop(job: LoadedJob, src: int, dst: int) -> Optional[str]:
    """Where the relayed chunks from src to dst stopped: device copy, wire, or host copy."""
    s, d = _relay_peer(job, src, dst), _relay_peer(job, dst, src)
    if s is None:
        return None
    if d is not None and s.sent > d.received:
        return (f"relay {src} -> {dst}: data stopped on the wire: rank {src} sent {s.sent} of {s.send_chunks} "
                f"chunks, rank {dst} received {d.received}")
    if d is None and s.sent > 0 and _any_relay(job, dst) is not None:
        return (f"relay {src} -> {dst}: data stopped on the wire: rank {src} sent {s.sent} of {s.send_chunks} "
                f"chunks, rank {dst} (in the relay) received none")
    if s.copied_in < s.send_chunks and s.sent >= s.copied_in:
        return (f"relay {src} -> {dst}: data stopped in the device-to-host copy at rank {src} "
                f"({s.copied_in} of {s.send_chunks} chunks staged)")
    if d is not None and d.copied_out < d.received:
        return (f"relay {src} -> {dst}: data stopped in the host-to-device copy at rank {dst} "
                f"({d.copied_out} of {d.received} received chunks copied out)")
    return None


def _island_phase(job: LoadedJob, rank: int) -> Optional[str]:
    """The phase of this rank's in-flight hierarchical op (its islands communicator)."""
    d = job.dumps.get(rank)
    for v in d.comms.values() if d else ():
        if v.backend == "islands" and v.in_flight is not None:
            return v.in_flight.phase
    return None


def _wire_stop(job: LoadedJob, src: int, dst: int) -> Optional[str]:
    """Equal islands exchange host memory by a native collective (phase "wire": no device
    copy on either end): a stall there can only be on the wire."""
    a, b = _island_phase(job, src), _island_phase(job, dst)
    if a == "wire" and b == "wire":
        return (f"link {src} -> {dst}: data stopped on the wire: both ranks are in the host-memory step "
                "between islands (phase wire, no device copy on either end)")
    return None


def _relay_in_flight(job: LoadedJob, rank: int) -> Optional[tuple[CommKey, CommView]]:
    """The comm whose in-flight relay op has chunk counters on this rank."""
    d = job.dumps.get(rank)
    for c, v in d.comms.items() if d else ():
        if v.in_flight is not None and v.in_flight.relay:
            return c, v
    return None


def _any_relay(job: LoadedJob, rank: int) -> Optional[tuple[object, CommView]]:
    """The comm of an in-flight relay op that has no counters yet (its links still starting)."""
    d = job.dumps.get(rank)
    for c, v in d.comms.items() if d else ():
        if v.in_flight is not None and v.in_flight.rec.op == "relay":
            return c, v
    return None


def relay_link_verdicts(job: LoadedJob, stall_s: float, blamed: set[int]) -> list[Verdict]:
    """Relay links whose chunks left the sender and never reached the receiver, both ends
    in the relay and neither moving for the stall time: blame the link, in that direction.

    A relay is a point-to-point op (no collective seq), so the ring walk of stuck
    collectives does not see it; its chunk counters per peer and stage say the same thing.
    """
    out = []
    for src in sorted(job.dumps):
        here = _relay_in_flight(job, src)
        if here is None or src in blamed:
            continue
        comm, v = here
        if v.waiting_s is not None and v.waiting_s < stall_s:
            continue
        for p in v.in_flight.relay if v.in_flight is not None else ():
            dst = p.peer
            there = _relay_in_flight(job, dst) or _any_relay(job, dst)
            if there is None or dst in blamed or there[0] != comm or p.sent == 0:
                continue
            back = _relay_peer(job, dst, src)
            got = back.received if back is not None else 0
            if back is not None and (got >= p.sent or got >= back.recv_chunks):
                continue
            seen = (f"received {got} of {back.recv_chunks}" if back is not None else
                    "has received nothing from it (it still waits for the link's first frame)")
            ev = [f"rank {src} handed {p.sent} of {p.send_chunks} chunk(s) for rank {dst} to the wire; rank {dst}, "
                  f"in the same relay, {seen}",
                  f"neither end moved for {v.waiting_s or 0:.1f} s (stall time {stall_s:.1f} s)"]
            out.append(Verdict(VerdictKind.LINK_STALLED, [], f"relay link {src} -> {dst} stalled: chunks rank {src} "
                               f"sent never reached rank {dst}", ev, links=[(src, dst)], comm=comm, seq=None,
                               op="relay", confidence=confidence(VerdictKind.LINK_STALLED, "relay_wire")))
    return out
