"""Compact per-rank summaries, built from a dump the moment it is parsed.

Why: the diagnosis must hold 16,384 ranks in memory at once, so a rank is reduced to
what the stages use — per communicator the in-flight op with its per-peer progress,
the last completed sequence ids, the link counters and only the last few op records
(`Rec`) — and the parsed JSON is dropped. Everything here is tolerant: a missing or
mistyped optional field becomes None; only what identifies a file (schema, rank)
raises `SchemaError`, which the loader turns into a data problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from .stacks import innermost_frame
from .types import CommKey

__all__ = [
    "SchemaError", "OpSig", "Rec", "IslandPhases", "PeerProg", "RelayPeer", "InFlight", "LinkStat", "LinkReconnect",
    "ReconnectEvent",
    "AbortInfo", "CauseInfo", "Wait",
    "CommView",
    "RankDump", "RankMeta",
    "rec_from_entry", "dump_from_doc", "meta_from_doc", "check_schema", "op_name",
]

DUMP_SCHEMA = "hetobs.dump"
RANK_SCHEMA = "hetobs.rank"
SUPPORTED_MAJOR = 2  # 2.x: membership in comms/comm-<id>-<hash>.json (docs/dump-schema.md)
OLDEST_MAJOR = 1     # 1.x: membership and ring inline in every dump and rank file


class SchemaError(ValueError):
    """The document is not a dump this reader can use (wrong schema, newer major version...)."""


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> Any:
    """A list field, or () when the file holds something else there (a mistyped field is absent)."""
    return v if isinstance(v, (list, tuple)) else ()


def _ranks(v: Any) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)):
        return tuple(x for x in v if isinstance(x, int) and not isinstance(x, bool))
    return ()


def op_name(profiling_name: Any) -> Optional[str]:
    """"nccl:all_reduce" -> "all_reduce" (FR names carry the backend before a colon)."""
    if not isinstance(profiling_name, str):
        return None
    return profiling_name.rsplit(":", 1)[-1] or None


def check_schema(doc: Any, schema: str) -> str:
    """Raise SchemaError unless `doc` is a `schema` document of a readable version; return the version."""
    if not isinstance(doc, dict):
        raise SchemaError(f"not a JSON object (found {type(doc).__name__})")
    name = doc.get("schema")
    if name != schema:
        raise SchemaError(f"schema is {name!r}, expected {schema!r}")
    version = doc.get("version")
    if not isinstance(version, str) or not version.split(".")[0].isdigit():
        raise SchemaError(f"version {version!r} is not 'MAJOR.MINOR'")
    major = int(version.split(".")[0])
    if major > SUPPORTED_MAJOR:
        raise SchemaError(f"{schema} version {version} is newer than this reader "
                          f"(reads {SUPPORTED_MAJOR}.x): upgrade hetobs to read it")
    if major < OLDEST_MAJOR:
        raise SchemaError(f"{schema} version {version} is older than any this reader knows")
    return version


class OpSig(NamedTuple):
    """What every rank must agree on at one sequence id."""

    op: Optional[str]
    dtype: Optional[str]
    count: Optional[int]  # type: ignore[assignment]  # shadows tuple.count, which nothing calls on these
    root: Optional[int]

    def text(self) -> str:
        s = f"{self.op} count {self.count} {self.dtype}"
        return s + (f" root {self.root}" if self.root is not None else "")


class IslandPhases(NamedTuple):
    """Busy ns of each phase of a hierarchical (island) op, and its relay chunks (dump 1.1 `phases`)."""

    vendor_ns: int
    d2h_ns: int
    wire_ns: int
    h2d_ns: int
    chunks: int

    def slowest(self) -> Optional[str]:
        """The phase ("vendor", "d2h", "wire", "h2d") that was busy longest; None if none was busy."""
        best = max(("vendor", "d2h", "wire", "h2d"), key=lambda p: getattr(self, f"{p}_ns"))
        return best if getattr(self, f"{best}_ns") > 0 else None


def _phases(v: Any) -> Optional[IslandPhases]:
    if type(v) is not dict:
        return None
    raw = (v.get(k) for k in IslandPhases._fields)
    return IslandPhases(*(x if type(x) is int else 0 for x in raw))


class Rec(NamedTuple):
    """One op record, summarized (from a dump entry or an in-flight op)."""

    seq: int  # collective sequence id (0 for point-to-point)
    p2p_seq: int
    op: Optional[str]
    dtype: Optional[str]
    count: Optional[int]  # type: ignore[assignment]  # shadows tuple.count, which nothing calls on these
    root: Optional[int]
    peer: Optional[int]
    state: str
    started_ns: Optional[int]
    completed_ns: Optional[int]
    nbytes: Optional[int]
    error: Optional[str]
    island: Optional[str] = None  # the rank's island, for a hierarchical op (dump 1.1); else None
    phases: Optional[IslandPhases] = None  # its phase times (an in-flight op has none yet)

    @property
    def sig(self) -> OpSig:
        return OpSig(self.op, self.dtype, self.count, self.root)


class PeerProg(NamedTuple):
    """Per-peer progress of an in-flight op, in frames ("steps"), both directions."""

    peer: int  # global rank
    transport: Optional[str]
    send_posted: Optional[int]
    sent: Optional[int]
    acked: Optional[int]
    send_done: Optional[int]
    recv_posted: Optional[int]
    received: Optional[int]
    recv_done: Optional[int]
    since_change_s: Optional[float]


class RelayPeer(NamedTuple):
    """How far the chunks of an in-flight relay op got with one peer (dump 1.1 `relay`)."""

    peer: int         # global rank
    send_chunks: int  # chunks this rank sends the peer...
    copied_in: int    # ...copied into host staging so far (device->host)
    sent: int         # ...handed to the wire
    recv_chunks: int  # chunks this rank receives from the peer...
    received: int     # ...arrived
    copied_out: int   # ...copied out of staging (host->device)


class Wait(NamedTuple):
    """One peer an in-flight op still waits on, in one direction (dump 2.1 `in_flight.waiting_on`)."""

    rank: int  # global rank
    direction: str  # "send" | "recv"
    posted: Optional[int]
    done: Optional[int]


class InFlight(NamedTuple):
    rec: Rec
    algorithm: Optional[str]
    seconds_in_op: Optional[float]
    peers: tuple[PeerProg, ...]
    phase: Optional[str] = None  # a hierarchical op's current phase (vendor, relay, ...), dump 1.1
    relay: tuple[RelayPeer, ...] = ()  # a relay op's chunks per peer and stage, dump 1.1
    waits: Optional[tuple[Wait, ...]] = None  # dump 2.1 `waiting_on`; None: the dump predates it

    def waited_ranks(self) -> list[int]:
        """The distinct ranks of `waits`, in the dump's order ([] when there are none or none are known)."""
        out: list[int] = []
        for w in self.waits or ():
            if w.rank not in out:
                out.append(w.rank)
        return out

    def peer(self, global_peer: int) -> Optional[PeerProg]:
        for p in self.peers:
            if p.peer == global_peer:
                return p
        return None

    def stalled_for(self) -> Optional[float]:
        """Seconds since this op last moved (the least stale peer), else time in op."""
        changes = [p.since_change_s for p in self.peers if p.since_change_s is not None]
        if changes:
            return min(changes) if self.seconds_in_op is None else min(min(changes), self.seconds_in_op)
        return self.seconds_in_op


class TcpHealth(NamedTuple):
    """`links[].tcp` of a dump: the kernel's TCP_INFO for the link's connection at dump time."""

    rtt_us: Optional[int]
    rttvar_us: Optional[int]
    retransmits_total: Optional[int]
    retransmitting: Optional[int]
    unacked: Optional[int]
    lost: Optional[int]
    delivery_rate_bps: Optional[int]
    ms_since_data_recv: Optional[int]
    ms_since_ack_recv: Optional[int]
    ms_since_data_sent: Optional[int]
    bytes_acked: Optional[int]
    bytes_received: Optional[int]
    rate_app_limited: Optional[int] = None  # 1: the rate sample measured the sender, not the path

    def ms_since_heard(self) -> Optional[int]:
        """Milliseconds since any packet (data or ack) arrived from the peer."""
        known = [x for x in (self.ms_since_data_recv, self.ms_since_ack_recv) if x is not None]
        return min(known) if known else None


def _tcp_health(t: Any) -> Optional[TcpHealth]:
    if not isinstance(t, dict):
        return None
    return TcpHealth(*(_int(t.get(f)) for f in TcpHealth._fields))


class ReconnectEvent(NamedTuple):
    """One event of `links[].reconnect.events`, oldest first."""

    time_ns: Optional[int]  # wall clock
    what: str  # the sentence, for people ("" when a dump has none)
    stage: Optional[str] = None  # broke | dial | probe | resume | end; None: a dump from before the fields
    errno: int = 0  # errno the attempt's connects ended in (ECONNREFUSED: refused); 0: none
    refused_ns: int = 0  # how long every connect had been refused when the attempt ended

    def has_fields(self) -> bool:
        """Whether the dump wrote the event as data (`stage`, `errno`), not only as a sentence."""
        return self.stage is not None


class LinkReconnect(NamedTuple):
    """`links[].reconnect`: what re-making the link met (docs/reconnect.md)."""

    state: Optional[str]  # up | re-making | down | closed
    breaks: int
    attempts: int
    events: tuple[ReconnectEvent, ...]  # oldest first


def _reconnect_event(e: Any) -> Optional[ReconnectEvent]:
    if not isinstance(e, dict):
        return None
    what, stage = _str(e.get("what")), _str(e.get("stage"))
    if what is None and stage is None:
        return None
    return ReconnectEvent(_int(e.get("time_ns")), what or "", stage, _int(e.get("errno")) or 0,
                          _int(e.get("refused_ns")) or 0)


def _reconnect(r: Any) -> Optional[LinkReconnect]:
    if not isinstance(r, dict):
        return None
    events = tuple(ev for ev in map(_reconnect_event, _list(r.get("events"))) if ev is not None)
    return LinkReconnect(_str(r.get("state")), _int(r.get("breaks")) or 0, _int(r.get("attempts")) or 0, events)


class LinkStat(NamedTuple):
    peer: int
    transport: Optional[str]
    bytes_sent: Optional[int]
    bytes_recv: Optional[int]
    busy_ns: Optional[int]
    tcp: Optional[TcpHealth] = None
    reconnect: Optional[LinkReconnect] = None


class AbortInfo(NamedTuple):
    """`comms[].abort` (dump 1.1): why the communicator failed, as the native core knew it."""

    kind: str  # peer_closed | transport | mismatch | timeout | other
    reporter: Optional[int]  # global rank that saw the failure first-hand
    suspect: Optional[int]  # global rank the failure points at
    received_from: Optional[int]  # global rank whose abort notice brought the news (None: first-hand)
    deviating: tuple[int, ...]  # mismatch: the deviants the ranks' majority vote named


class CauseInfo(NamedTuple):
    """`cause_info` (dump 2.1, on the dump and on each failed comm): a failure or hang as data.

    The kind is kept as written (causes.py maps it onto its `CauseKind`); ranks are global."""

    kind: str  # hang | peer_closed | transport | mismatch | timeout | other
    culprits: tuple[int, ...]
    reporter: Optional[int]
    messengers: tuple[int, ...]
    op: Optional[str]
    seq: Optional[int]
    peer: Optional[int]
    gone: bool = False  # first-hand: `peer`'s listener refused every redial
    # data_mismatch only (HETOBS_DIGEST): the communicator and the first differing element.
    comm: Optional[int] = None
    element: Optional[int] = None


def _cause_info(c: Any) -> Optional[CauseInfo]:
    if type(c) is not dict or type(c.get("kind")) is not str:
        return None
    return CauseInfo(c["kind"], _ranks(c.get("culprits")), _int(c.get("reporter")), _ranks(c.get("messengers")),
                     _str(c.get("op")), _int(c.get("seq")), _int(c.get("peer")), c.get("gone") is True,
                     _int(c.get("comm_id")), _int(c.get("element")))


def _waits(v: Any) -> Optional[tuple[Wait, ...]]:
    if not isinstance(v, list):
        return None
    out = []
    for w in v:
        if type(w) is dict and _int(w.get("rank")) is not None and w.get("direction") in ("send", "recv"):
            out.append(Wait(w["rank"], w["direction"], _int(w.get("posted")), _int(w.get("done"))))
    return tuple(out)


def _abort(a: Any) -> Optional[AbortInfo]:
    if not isinstance(a, dict) or not isinstance(a.get("kind"), str):
        return None
    return AbortInfo(a["kind"], _int(a.get("reporter")), _int(a.get("suspect")), _int(a.get("received_from")),
                     _ranks(a.get("deviating")))


@dataclass(slots=True)
class CommView:
    """One rank's view of one communicator at dump time."""

    comm: CommKey
    size: Optional[int] = None
    members: Optional[tuple[int, ...]] = None  # global ranks (interned, shared across ranks)
    ring: Optional[tuple[int, ...]] = None
    membership_hash: Optional[str] = None  # 2.x: names comms/comm-<id>-<hash>.json instead of the lists
    comm_rank: Optional[int] = None  # this rank's index in the communicator
    last_seq: Optional[int] = None  # last collective seq this rank issued/finished
    last_p2p_seq: Optional[int] = None
    failed: bool = False
    cause: Optional[str] = None
    abort: Optional[AbortInfo] = None
    cause_info: Optional[CauseInfo] = None  # dump 2.1: the failure as data (None: not failed, or older)
    in_flight: Optional[InFlight] = None
    links: tuple[LinkStat, ...] = ()
    recent: list[Rec] = field(default_factory=list)  # last few records, oldest first
    waiting_s: Optional[float] = None  # how long its in-flight op has not moved (None: unknown)
    backend: Optional[str] = None  # native, gloo, nccl, mpi, islands
    name: Optional[str] = None     # e.g. "gloo:island:a" for an island's library
    island: Optional[str] = None   # this rank's island, on a hierarchical (islands) communicator

    def position(self) -> Optional[int]:
        """Highest collective seq this rank has called on the communicator."""
        best = self.last_seq
        if self.in_flight is not None and self.in_flight.rec.seq:
            best = max(best or 0, self.in_flight.rec.seq)
        for r in self.recent:
            if r.seq:
                best = max(best or 0, r.seq)
        return best

    def op_at(self, seq: int) -> Optional[Rec]:
        if self.in_flight is not None and self.in_flight.rec.seq == seq:
            return self.in_flight.rec
        for r in reversed(self.recent):
            if r.seq == seq:
                return r
        return None


@dataclass(slots=True)
class RankDump:
    """One rank's dump of the incident, summarized."""

    rank: int
    path: str
    host: Optional[str] = None
    pid: Optional[int] = None
    process_start_time: Optional[int] = None
    reason: Optional[str] = None
    cause: Optional[str] = None
    cause_info: Optional[CauseInfo] = None  # dump 2.1: the cause as data (watchdog and error dumps)
    requested_by: Optional[int] = None
    time_ns: Optional[int] = None
    heartbeat_ns: Optional[int] = None
    last_progress_ns: Optional[int] = None
    hang_timeout_s: Optional[float] = None
    asked: tuple[int, ...] = ()
    answered: tuple[int, ...] = ()
    unanswered: tuple[int, ...] = ()
    python_status: Optional[str] = None
    where: Optional[str] = None  # innermost Python frame of the main thread
    comms: dict[CommKey, CommView] = field(default_factory=dict)
    world_size: Optional[int] = None
    incident: Optional[str] = None
    # The stall at which this rank's watchdog suspected the hang (the dump's `suspected`), else None.
    suspect_threshold_s: Optional[float] = None


@dataclass(slots=True)
class RankMeta:
    """`ranks/rank-<r>.json`, summarized."""

    rank: int
    path: str
    world_size: Optional[int] = None
    host: Optional[str] = None
    host_key: Optional[str] = None
    pid: Optional[int] = None
    process_start_time: Optional[int] = None
    start_time_ns: Optional[int] = None
    exited_cleanly: bool = False
    exit_time_ns: Optional[int] = None
    exit_code: Optional[int] = None  # what the process passed to exit() (None: not recorded)
    exit_signal: Optional[int] = None  # the fatal signal it died of, when it could record it
    hang_timeout_s: Optional[float] = None
    stats_segment: Optional[str] = None
    rings: dict[CommKey, tuple[int, ...]] = field(default_factory=dict)
    members: dict[CommKey, tuple[int, ...]] = field(default_factory=dict)
    island: Optional[str] = None  # from its hierarchical communicator, if it ran in one
    membership_hashes: dict[CommKey, str] = field(default_factory=dict)  # 2.x
    comm_ranks: dict[CommKey, int] = field(default_factory=dict)
    comm_sizes: dict[CommKey, int] = field(default_factory=dict)


def rec_from_entry(e: dict[str, Any]) -> Rec:
    """A dump entry (hetobs or Flight Recorder field names) as a `Rec`.

    Called for every kept record of every rank, so written for speed (no helpers).
    """
    g = e.get
    op = g("op")
    if type(op) is not str:
        op = op_name(g("profiling_name"))
    dtype = g("dtype")
    if type(dtype) is not str:
        dts = g("input_dtypes")
        dtype = dts[0] if type(dts) is list and dts and type(dts[0]) is str else None
    count = g("count")
    if type(count) is not int:
        count = None
        sizes = g("input_sizes")
        if type(sizes) is list:
            total = 0
            for shape in sizes:
                if type(shape) is list:
                    n = 1
                    for d in shape:
                        n *= d if type(d) is int else 1
                    total += n
            count = total
    seq, p2p, root, peer = g("collective_seq_id"), g("p2p_seq_id"), g("root"), g("peer")
    started, completed = g("time_discovered_started_ns"), g("time_discovered_completed_ns")
    state, nbytes, error, island = g("state"), g("bytes"), g("error"), g("island")
    return Rec(
        seq if type(seq) is int else 0, p2p if type(p2p) is int else 0, op, dtype, count,
        root if type(root) is int else None, peer if type(peer) is int else None,
        state if type(state) is str else "unknown",
        started if type(started) is int and started else None,
        completed if type(completed) is int and completed else None,
        nbytes if type(nbytes) is int else None, error if type(error) is str else None,
        island if type(island) is str and island else None, _phases(g("phases")),
    )


def _peer_prog(p: dict[str, Any]) -> Optional[PeerProg]:
    peer = _int(p.get("global_peer"))
    if peer is None:
        peer = _int(p.get("peer"))
    if peer is None:
        return None
    send, recv = _dict(p.get("send")), _dict(p.get("recv"))
    return PeerProg(peer, _str(p.get("transport")), _int(send.get("posted")), _int(send.get("sent")),
                    _int(send.get("acked")), _int(send.get("done")), _int(recv.get("posted")),
                    _int(recv.get("received")), _int(recv.get("done")), _num(p.get("seconds_since_change")))


def _in_flight(f: Any) -> Optional[InFlight]:
    if not isinstance(f, dict):
        return None
    rec = rec_from_entry(f)
    if rec.started_ns is None:
        rec = rec._replace(started_ns=_int(f.get("time_created_ns")) or None)
    peers = tuple(pp for pp in (_peer_prog(p) for p in _list(f.get("peers")) if isinstance(p, dict)) if pp)
    return InFlight(rec, _str(f.get("algorithm")), _num(f.get("seconds_in_op")), peers, _str(f.get("phase")),
                    _relay(f.get("relay")), _waits(f.get("waiting_on")))


def _relay(r: Any) -> tuple[RelayPeer, ...]:
    if not isinstance(r, dict):
        return ()
    out = []
    for p in _list(r.get("peers")):
        if not isinstance(p, dict):
            continue
        peer = _int(p.get("global_peer"))
        send, recv = p.get("send"), p.get("recv")
        if peer is None or not isinstance(send, dict) or not isinstance(recv, dict):
            continue
        counts = [_int(d.get(k)) for d, k in ((send, "chunks"), (send, "copied_in"), (send, "sent"),
                                               (recv, "chunks"), (recv, "received"), (recv, "copied_out"))]
        rp = RelayPeer(peer, *(c if c is not None and c >= 0 else 0 for c in counts))
        if r.get("stage") == "none":  # host memory on the wire as it is: no copy stage to wait on
            rp = rp._replace(copied_in=rp.send_chunks, copied_out=rp.received)
        out.append(rp)
    return tuple(out)


def _comm_view(c: dict[str, Any]) -> Optional[CommView]:
    cid = _int(c.get("comm_id"))
    if cid is None:
        return None
    links = []
    for lk in _list(c.get("links")):
        if isinstance(lk, dict):
            peer = _int(lk.get("global_peer"))
            peer = _int(lk.get("peer")) if peer is None else peer
            if peer is not None:
                links.append(LinkStat(peer, _str(lk.get("transport")), _int(lk.get("bytes_sent")),
                                      _int(lk.get("bytes_recv")), _int(lk.get("busy_ns")),
                                      _tcp_health(lk.get("tcp")), _reconnect(lk.get("reconnect"))))
    members = c.get("global_ranks")
    ring = c.get("ring")
    view = CommView(
        comm=cid, size=_int(c.get("size")),
        members=members if isinstance(members, tuple) else (_ranks(members) or None),
        ring=ring if isinstance(ring, tuple) else (_ranks(ring) or None),
        last_seq=_int(c.get("last_coll_seq")), last_p2p_seq=_int(c.get("last_p2p_seq")),
        failed=bool(c.get("failed")), cause=_str(c.get("cause")), abort=_abort(c.get("abort")),
        cause_info=_cause_info(c.get("cause_info")),
        in_flight=_in_flight(c.get("in_flight")), links=tuple(links),
        backend=_str(c.get("backend")), name=_str(c.get("name")), island=_str(c.get("island")),
        membership_hash=_membership_hash(c), comm_rank=_int(c.get("rank")),
    )
    if view.in_flight is not None:
        view.waiting_s = view.in_flight.stalled_for()
    return view


def dump_from_doc(doc: dict[str, Any], records: list[dict[str, Any]], path: str, keep: int) -> RankDump:
    """Summarize a parsed `hetobs.dump` (header without entries, plus its last records)."""
    check_schema(doc, DUMP_SCHEMA)
    rank = _int(doc.get("rank"))
    if rank is None or rank < 0:
        raise SchemaError(f"'rank' is {doc.get('rank')!r}, expected a non-negative integer")
    sc, py = _dict(doc.get("side_channel")), _dict(doc.get("python"))
    d = RankDump(
        rank=rank, path=path, host=_str(doc.get("host")), pid=_int(doc.get("pid")),
        process_start_time=_int(doc.get("process_start_time")), reason=_str(doc.get("reason")),
        cause=_str(doc.get("cause")), cause_info=_cause_info(doc.get("cause_info")),
        requested_by=_int(doc.get("requested_by")), time_ns=_int(doc.get("time_ns")),
        heartbeat_ns=_int(doc.get("heartbeat_ns")), last_progress_ns=_int(doc.get("last_progress_ns")),
        hang_timeout_s=_num(doc.get("hang_timeout_s")), asked=_ranks(sc.get("asked")),
        answered=_ranks(sc.get("answered")), unanswered=_ranks(sc.get("unanswered")),
        python_status=_str(py.get("status")), where=innermost_frame(py.get("stacks")),
        world_size=_int(doc.get("world_size")), incident=_str(doc.get("incident")),
        suspect_threshold_s=_num(doc["suspected"].get("threshold_s")) if isinstance(doc.get("suspected"), dict)
        else None,
    )
    for c in _list(doc.get("comms")):
        if isinstance(c, dict):
            view = _comm_view(c)
            if view is not None:
                d.comms[view.comm] = view
    add_records(d, records, keep)
    return d


def add_records(d: RankDump, records: list[dict[str, Any]], keep: int) -> None:
    """File the last records under their communicator (creating views FR dumps lack)."""
    for e in records:
        if not isinstance(e, dict):
            continue
        cid = _int(e.get("comm_id"))
        if cid is None:
            cid = _int(e.get("pg_id"))
        if cid is None:
            continue
        view = d.comms.get(cid)
        if view is None:
            view = d.comms[cid] = CommView(comm=cid)
        view.recent.append(rec_from_entry(e))
    for view in d.comms.values():
        if len(view.recent) > keep:
            del view.recent[:-keep]


def meta_from_doc(doc: Any, path: str) -> RankMeta:
    """Summarize a parsed `hetobs.rank` metadata document."""
    check_schema(doc, RANK_SCHEMA)
    rank = _int(doc.get("rank"))
    if rank is None or rank < 0:
        raise SchemaError(f"'rank' is {doc.get('rank')!r}, expected a non-negative integer")
    m = RankMeta(
        rank=rank, path=path, world_size=_int(doc.get("world_size")), host=_str(doc.get("host")),
        host_key=_str(doc.get("host_key")), pid=_int(doc.get("pid")),
        process_start_time=_int(doc.get("process_start_time")), start_time_ns=_int(doc.get("start_time_ns")),
        exited_cleanly=doc.get("exited_cleanly") is True, exit_time_ns=_int(doc.get("exit_time_ns")),
        hang_timeout_s=_num(doc.get("hang_timeout_s")), stats_segment=_str(doc.get("stats_segment")),
        exit_code=_int(_dict(doc.get("exit_status")).get("code")),
        exit_signal=_int(_dict(doc.get("exit_status")).get("signal")),
    )
    if m.exit_signal is not None or m.exit_code not in (None, 0):
        m.exited_cleanly = False  # a non-zero exit is never clean, whatever an older writer said
    for c in _list(doc.get("comms")):
        if isinstance(c, dict) and _int(c.get("comm_id")) is not None:
            ring, members = c.get("ring"), c.get("global_ranks")
            if isinstance(ring, (tuple, list)):
                m.rings[c["comm_id"]] = tuple(ring)
            if isinstance(members, (tuple, list)):
                m.members[c["comm_id"]] = tuple(members)
            m.island = m.island or _str(c.get("island"))
            cid, h, cr, size = c["comm_id"], _membership_hash(c), _int(c.get("rank")), _int(c.get("size"))
            if h is not None:
                m.membership_hashes[cid] = h
            if cr is not None:
                m.comm_ranks[cid] = cr
            if size is not None:
                m.comm_sizes[cid] = size
    return m


def _membership_hash(c: dict[str, Any]) -> Optional[str]:
    ref = c.get("membership")
    h = ref.get("hash") if isinstance(ref, dict) else None
    return h if type(h) is str and 0 < len(h) <= 64 and h.isalnum() else None
