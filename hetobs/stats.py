"""Read a rank's live stats segment from outside the process (layout: csrc/include/hetobs/stats/layout.h).

The reader never locks the writer: communicator stats and records carry a seqlock
(odd while written), so a copy is retried until two reads of the version agree.
A segment whose process is gone, whose pid now belongs to another process (start time
differs), or that was made in another boot of the machine (boot id differs: the pid
then means nothing), is reported `stale` rather than trusted.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from typing import Iterator

from . import codes
from .ownership import not_ours

__all__ = [
    "StatsError", "RankStats", "CommStats", "LinkStats", "OpKindStats", "read_segment", "segment_paths",
    "process_state", "OP_KINDS", "LATENCY_BUCKETS", "BANDWIDTH_BUCKETS", "LAG_BUCKETS", "Arrivals", "IslandTotals",
    "ISLAND_PHASES", "boot_id", "other_boot",
]

MAGIC = b"HTBSTATS"
# The layout version the native core writes, its codes' names and its bucket counts come from
# _core (hetobs/codes.py), never retyped here. Layout history: 2: island fields in the header
# and in each op record; 3: a CommStats slot for relay ops; 4: each op record names its device
# and library; 5: the header's boot id.
VERSION = codes.STATS_LAYOUT_VERSION
OP_KINDS = codes.OP_KINDS
# Versions read, with the op kinds each one's CommStats counts (facts of past layouts, so
# numbers: a kind appended later changes the current layout only): only comm_bytes grew from 2
# to 3 (and comms are stepped by comm_bytes), so a segment of a rank still on the older build
# reads the same, without relay counts. 5 appended the header's boot id (older segments: their
# boot is not known, and not judged). tests/test_stats_segment.py checks the current version is here.
_OP_KINDS_OF_VERSION = {2: 11, 3: 12, 4: 12, 5: 12}
LATENCY_BUCKETS = codes.LATENCY_BUCKETS
BANDWIDTH_BUCKETS = codes.BANDWIDTH_BUCKETS
LAG_BUCKETS = codes.LAG_BUCKETS
_DTYPES = codes.DTYPES
_STATES = codes.OP_STATES
_ALGOS = codes.ALGORITHMS
_BACKENDS = codes.BACKENDS
# Busy-time phases of a hierarchical op, in the order of the header's totals and a record's `phases`.
ISLAND_PHASES = ("vendor", "d2h", "wire", "h2d")

# (offset, struct format) of the header fields read here; tests check them against the C++ offsets.
_HEADER = struct.Struct("<8sII" "IIIIII" "QQQQ" "iiii" "Q" "64s64s" "d" "qq" "QQQ" "III" "I" "q" "16s" "QQQQ" "QQ")
_HEADER_V4 = struct.Struct("<16s16s")  # version 4: the island's device and library, after _HEADER
_HEADER_V5 = struct.Struct("<40s")  # version 5: the boot id, after _HEADER_V4
# Appended to version 5 without a bump (a segment of an older build reads zeros there, which
# is true of it): suspected hangs dumped and resolved, 8-aligned after the boot id.
_HEADER_SUSPECT = struct.Struct("<QQ")
_SUSPECT_AT = (_HEADER.size + _HEADER_V4.size + _HEADER_V5.size + 7) // 8 * 8
_HEADER_FIELDS = (
    "magic", "version", "header_bytes",
    "comm_capacity", "comm_bytes", "link_capacity", "link_bytes", "record_capacity", "record_bytes",
    "comms_offset", "links_offset", "records_offset", "total_bytes",
    "pid", "rank", "world_size", "reserved0",
    "process_start_ticks", "job", "host", "hang_timeout_s",
    "heartbeat_ns", "last_progress_ns", "hangs_detected", "dumps_written", "records_next",
    "state", "comms_used", "links_used", "reserved1", "wall_minus_mono_ns",
    "island", "island_vendor_ns", "island_d2h_ns", "island_wire_ns", "island_h2d_ns", "island_chunks", "island_ops",
)
_COMM_HEAD = struct.Struct("<QQiiQQQqII")  # version .. failed (64 bytes)
_OPKIND = struct.Struct("<QQQQ" + "Q" * (LATENCY_BUCKETS + BANDWIDTH_BUCKETS))
# Who arrived last (record/arrival.h), appended to CommStats within the same version: present
# when comm_bytes has room for it after the op kinds (segments of older builds lack it).
_ARRIVALS = struct.Struct("<QiIqQQ" + "Q" * LAG_BUCKETS)  # judged, latest rank, pad, latest lag, last, lag sum, lag
_DIGESTS = struct.Struct("<QQ")  # after _ARRIVALS: digests checked, data mismatches (HETOBS_DIGEST)
_LINK = struct.Struct("<Qii8s" "QQQQqq" "QQQQQQQq" "Q")  # ..., reconnects
# LinkHealth (record/link_health.h), appended after _LINK within the same version: present
# when link_bytes has room for it (segments of older builds lack it; their links read as before).
_HEALTH = struct.Struct("<Qq" "QQQQQQQQQ" "QQQ" "Q")
HEALTH_FIELDS = ("rtt_us", "rttvar_us", "retransmits_total", "retransmitting", "unacked", "lost",
                 "delivery_rate_bps", "bytes_acked", "bytes_received", "ms_since_data_sent",
                 "ms_since_data_recv", "ms_since_ack_recv", "rate_app_limited")
_RECORD = struct.Struct("<QQQQQQQQqqqddiiiBBBBBBB5x96s" "16s" "qqqq" "I4x")
_RECORD_NAMES = struct.Struct("<16s16s")  # version 4: device and library, after _RECORD
# Appended within version 5 (present when record_bytes has room): last arrival, flags, lag, behind first.
_RECORD_ARRIVAL = struct.Struct("<iIqq")
_ARRIVAL_KNOWN, _ARRIVAL_JUDGED = 1, 2
_DEVICE_CODES = codes.DEVICE_TYPES


class StatsError(ValueError):
    """A stats segment cannot be read: missing, truncated, foreign or of another version."""


@dataclass(frozen=True)
class OpKindStats:
    calls: int
    bytes: int
    errors: int
    total_ns: int
    latency: tuple[int, ...]
    busbw: tuple[int, ...]


@dataclass(frozen=True)
class Arrivals:
    """Who arrived last at a communicator's collectives, as one rank counted them (record/arrival.h).

    `judged`: collectives whose every rank's entry reached this rank; `last`: of those, the ones
    this rank entered last (each op is counted on exactly one rank); `lag` buckets: how far
    behind the first rank it came then (bucket b: < 2**b µs), `lag_total_ns` their sum;
    `latest_rank` / `latest_lag_ns`: the newest judged op's last rank and lag (None before any).
    """

    judged: int
    last: int
    lag_total_ns: int
    lag: tuple[int, ...]
    latest_rank: int | None
    latest_lag_ns: int | None


@dataclass(frozen=True)
class CommStats:
    comm_id: int
    size: int
    rank: int
    coll_seq: int
    p2p_seq: int
    inflight_record: int | None  # record id of the running op
    inflight_start_ns: int | None  # wall clock
    inflight_op: str | None
    failed: bool
    ops: dict[str, OpKindStats]
    arrivals: Arrivals | None = None  # None: the segment predates arrival counting
    # Result digests (HETOBS_DIGEST): sampled collectives compared across ranks, and those where this
    # rank's result differed from the majority's. None: the segment predates them.
    digests_checked: int | None = None
    data_mismatches: int | None = None


@dataclass(frozen=True)
class LinkStats:
    comm_id: int
    peer: int
    global_peer: int
    transport: str
    bytes_sent: int
    bytes_recv: int
    frames_sent: int
    frames_recv: int
    busy_ns: int
    last_activity_ns: int  # wall clock, 0 if never
    progress: dict[str, int]
    reconnects: int = 0  # times the TCP connection broke and was re-made
    # TCP_INFO of the connection (HEALTH_FIELDS plus sampled_ns, wall clock); None when never
    # sampled (shm links) or the segment predates link health.
    tcp: dict[str, int] | None = None


@dataclass(frozen=True)
class IslandTotals:
    """A rank's hierarchical (island) ops so far: busy ns per phase (ISLAND_PHASES), relay chunks, ops."""

    phase_ns: dict[str, int]
    chunks: int
    ops: int


@dataclass(frozen=True)
class RankStats:
    path: str
    job: str
    rank: int
    world_size: int
    pid: int
    host: str
    process_start_ticks: int
    hang_timeout_s: float
    heartbeat_ns: int
    last_progress_ns: int
    hangs_detected: int
    dumps_written: int
    exited_cleanly: bool
    process: str  # alive | stopped | dead | reused | unknown
    comms: list[CommStats] = field(default_factory=list)
    links: list[LinkStats] = field(default_factory=list)
    records: list[dict[str, object]] = field(default_factory=list)
    island: str = ""  # the rank's island ("" when it runs no hierarchical op)
    island_device: str = ""   # its device type (cuda, npu, standin, cpu); "" before layout 4
    island_library: str = ""  # the collective library inside it (nccl, hccl, sccl, gloo, hetobs)
    island_totals: IslandTotals | None = None  # None when `island` is ""
    boot_id: str = ""  # the machine's boot the segment was made in ("" before layout 5: not known)
    hangs_suspected: int = 0  # suspected hangs this rank's watchdog dumped (docs/early-hangs.md)
    hangs_resolved: int = 0   # of them, those whose op then completed: slow, not hung

    @property
    def stale(self) -> bool:
        """True when the segment's process is gone: its numbers are history, not live state."""
        return self.process in ("dead", "reused")


def boot_id(proc: str = "/proc") -> str:
    """This machine's boot id ("" when it cannot be read)."""
    try:
        with open(f"{proc}/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def other_boot(boot: str | None, proc: str = "/proc") -> bool:
    """True when `boot` (a recorded boot id) is known and not this boot's: its pids mean nothing now."""
    if not boot:
        return False
    current = boot_id(proc)
    return bool(current) and current != boot


def process_state(pid: int, start_ticks: int, proc: str = "/proc", boot: str | None = None) -> str:
    """'alive', 'stopped' (SIGSTOP / traced), 'dead', 'reused' (pid now another process) or 'unknown'.

    `boot`: the boot id the pid was recorded in, when known; another boot's process is 'dead'
    (after a reboot a pid, even with equal start ticks, is some other process).
    """
    if other_boot(boot, proc):
        return "dead"
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except FileNotFoundError:
        return "dead"
    except OSError:
        return "unknown"
    rest = raw[raw.rfind(")") + 2:].split()
    if len(rest) < 20:
        return "unknown"
    if start_ticks and int(rest[19]) != start_ticks:
        return "reused"
    if rest[0] in ("Z", "X"):
        return "dead"
    return "stopped" if rest[0] in ("T", "t") else "alive"


def segment_name(job: str) -> str:
    """The segment name prefix of `job` (Segment::pathFor in csrc/src/stats/segment.cc), before the rank."""
    return "hetobs-stats-" + "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in job)[:100]


def segment_paths(job: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Every rank's segment of `job` on this node, sorted by rank.

    Names match exactly (prefix, then "-r" and digits only): job "train" never picks up
    "train-r1"'s segments, whose names start alike.
    """
    pattern = re.compile(re.escape(segment_name(job)) + r"-r(\d+)")
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    found = [(int(m.group(1)), name) for name in names if (m := pattern.fullmatch(name))]
    return [os.path.join(shm_dir, name) for _, name in sorted(found)]


def _seqlocked(buf: mmap.mmap, offset: int, size: int) -> bytes:
    for _ in range(1000):
        v1 = struct.unpack_from("<Q", buf, offset)[0]
        if v1 & 1:
            continue
        data = buf[offset:offset + size]
        if struct.unpack_from("<Q", buf, offset)[0] == v1:
            return data
    return buf[offset:offset + size]  # a writer stuck mid-update (stopped): take what is there


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace")


def _records(buf: mmap.mmap, h: dict[str, int], offset_ns: int, limit: int) -> Iterator[dict[str, object]]:
    cap, size, base, end = h["record_capacity"], h["record_bytes"], h["records_offset"], h["records_next"]
    start = max(0, end - cap, end - limit)
    named = h["version"] >= 4
    arrived = named and size >= _RECORD.size + _RECORD_NAMES.size + _RECORD_ARRIVAL.size
    want = _RECORD.size + (_RECORD_NAMES.size if named else 0) + (_RECORD_ARRIVAL.size if arrived else 0)
    for rid in range(start, end):
        raw = _seqlocked(buf, base + (rid % cap) * size, want)
        v = _RECORD.unpack_from(raw)
        device, library = _RECORD_NAMES.unpack_from(raw, _RECORD.size) if named else (b"", b"")
        last, flags, lag, behind = (_RECORD_ARRIVAL.unpack_from(raw, _RECORD.size + _RECORD_NAMES.size)
                                    if arrived else (0, 0, 0, 0))
        known = bool(flags & _ARRIVAL_KNOWN)
        if v[1] != rid:
            continue  # overwritten while we read
        op = OP_KINDS[v[16]] if v[16] < len(OP_KINDS) else "invalid"
        island = _cstr(v[24])
        yield {
            "record_id": rid, "comm_id": v[2], "collective_seq_id": v[3], "p2p_seq_id": v[4], "op": op,
            "count": v[5], "out_count": v[6], "bytes": v[7],
            "time_created_ns": v[8] + offset_ns if v[8] else None,
            "time_discovered_started_ns": v[9] + offset_ns if v[9] else None,
            "time_discovered_completed_ns": v[10] + offset_ns if v[10] else None,
            "algbw_gbps": v[11], "busbw_gbps": v[12], "root_or_peer": v[13], "comm_size": v[14], "comm_rank": v[15],
            "dtype": _DTYPES[v[17]] if v[17] < len(_DTYPES) else "invalid",
            "state": _STATES[v[19]] if v[19] < len(_STATES) else "invalid",
            "algorithm": _ALGOS[v[20]] if v[20] < len(_ALGOS) else "invalid",
            "backend": _BACKENDS[v[21]] if v[21] < len(_BACKENDS) else "invalid",
            "device_type": _cstr(device) or (_DEVICE_CODES[v[22]] if v[22] < len(_DEVICE_CODES) else "invalid"),
            "library": _cstr(library) or None,
            "error": _cstr(v[23]) or None,
            # Hierarchical (island) ops only; None for every other op (as in _core.records()).
            "island": island or None,
            "phases": {"vendor_ns": v[25], "d2h_ns": v[26], "wire_ns": v[27], "h2d_ns": v[28], "chunks": v[29]}
            if island else None,
            # Who arrived last (record/arrival.h), as this rank heard it; None where not known.
            "last_arrival_rank": last if known else None,
            "arrival_lag_ns": lag if known else None,
            "behind_first_ns": behind if known else None,
            "arrival_judged": bool(flags & _ARRIVAL_JUDGED) if known else None,
        }


def read_segment(path: str, *, records: int = 0, proc: str = "/proc") -> RankStats:
    """Read one segment. `records`: how many of the newest op records to include.

    Raises StatsError naming the file for anything that is not a readable segment of VERSION.
    """
    try:
        # /dev/shm is world-writable: never through a link, never a FIFO, never another user's.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise StatsError(f"{path}: cannot open ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StatsError(f"{path}: not a regular file (not a hetobs stats segment)")
        why = not_ours(st)
        if why:
            raise StatsError(f"{path}: {why}: not read (a segment only its owner can trust)")
        size = st.st_size
        if size < _HEADER.size:
            raise StatsError(f"{path}: truncated ({size} bytes; not a hetobs stats segment)")
        buf = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        h = dict(zip(_HEADER_FIELDS, _HEADER.unpack_from(buf, 0), strict=True))
        if h["magic"] != MAGIC:
            raise StatsError(f"{path}: not a hetobs stats segment (magic {h['magic']!r})")
        kinds = _OP_KINDS_OF_VERSION.get(h["version"])
        if kinds is None:
            raise StatsError(f"{path}: stats layout version {h['version']}, this hetobs reads versions "
                             f"{', '.join(map(str, sorted(_OP_KINDS_OF_VERSION)))}")
        if h["comm_bytes"] < _COMM_HEAD.size + kinds * _OPKIND.size:
            raise StatsError(f"{path}: comm_bytes {h['comm_bytes']} too small for version {h['version']}")
        if h["total_bytes"] > size:
            raise StatsError(f"{path}: truncated ({size} of {h['total_bytes']} bytes)")
        comms = []
        for i in range(min(h["comms_used"], h["comm_capacity"])):
            off = h["comms_offset"] + i * h["comm_bytes"]
            raw = _seqlocked(buf, off, h["comm_bytes"])
            v = _COMM_HEAD.unpack_from(raw, 0)
            ops = {}
            for k, name in enumerate(OP_KINDS[:kinds]):
                o = _OPKIND.unpack_from(raw, _COMM_HEAD.size + k * _OPKIND.size)
                ops[name] = OpKindStats(o[0], o[1], o[2], o[3], tuple(o[4:4 + LATENCY_BUCKETS]),
                                        tuple(o[4 + LATENCY_BUCKETS:]))
            arrivals = None
            at = _COMM_HEAD.size + kinds * _OPKIND.size
            if kinds == len(OP_KINDS) and h["comm_bytes"] >= at + _ARRIVALS.size:
                a = _ARRIVALS.unpack_from(raw, at)
                arrivals = Arrivals(judged=a[0], last=a[4], lag_total_ns=a[5], lag=tuple(a[6:6 + LAG_BUCKETS]),
                                    latest_rank=a[1] if a[0] else None, latest_lag_ns=a[3] if a[0] else None)
            checked = mismatches = None
            if arrivals is not None and h["comm_bytes"] >= at + _ARRIVALS.size + _DIGESTS.size:
                checked, mismatches = _DIGESTS.unpack_from(raw, at + _ARRIVALS.size)
            comms.append(CommStats(
                comm_id=v[1], size=v[2], rank=v[3], coll_seq=v[4], p2p_seq=v[5],
                inflight_record=v[6] - 1 if v[6] else None, inflight_start_ns=v[7] if v[6] else None,
                inflight_op=OP_KINDS[v[8]] if v[6] and v[8] < len(OP_KINDS) else None,
                failed=bool(v[9]), ops=ops, arrivals=arrivals, digests_checked=checked,
                data_mismatches=mismatches))
        links = []
        offset_ns = h["wall_minus_mono_ns"]
        with_health = h["link_bytes"] >= _LINK.size + _HEALTH.size
        for i in range(min(h["links_used"], h["link_capacity"])):
            at = h["links_offset"] + i * h["link_bytes"]
            v = _LINK.unpack_from(buf, at)
            tcp = None
            if with_health:
                hv = _HEALTH.unpack_from(buf, at + _LINK.size)
                if hv[0]:
                    tcp = dict(zip(HEALTH_FIELDS, hv[2:], strict=True), sampled_ns=hv[1])
            links.append(LinkStats(
                comm_id=v[0], peer=v[1], global_peer=v[2], transport=_cstr(v[3]),
                bytes_sent=v[4], bytes_recv=v[5], frames_sent=v[6], frames_recv=v[7], busy_ns=v[8],
                last_activity_ns=v[9] + offset_ns if v[9] else 0,
                progress=dict(zip(("send_posted", "send_sent", "send_acked", "send_done", "recv_posted",
                                   "recv_received", "recv_done"), v[10:17], strict=True),
                              last_change_ns=v[17] + offset_ns if v[17] else 0),
                reconnects=v[18], tcp=tcp))
        recs = list(_records(buf, h, offset_ns, records)) if records else []
        island = _cstr(h["island"])
        device, library = _HEADER_V4.unpack_from(buf, _HEADER.size) if h["version"] >= 4 else (b"", b"")
        boot = _cstr(_HEADER_V5.unpack_from(buf, _HEADER.size + _HEADER_V4.size)[0]) if h["version"] >= 5 else ""
        suspected, resolved = _HEADER_SUSPECT.unpack_from(buf, _SUSPECT_AT) if h["version"] >= 5 else (0, 0)
        return RankStats(
            path=path, job=_cstr(h["job"]), rank=h["rank"], world_size=h["world_size"], pid=h["pid"],
            host=_cstr(h["host"]), process_start_ticks=h["process_start_ticks"], hang_timeout_s=h["hang_timeout_s"],
            heartbeat_ns=h["heartbeat_ns"], last_progress_ns=h["last_progress_ns"],
            hangs_detected=h["hangs_detected"], dumps_written=h["dumps_written"], exited_cleanly=h["state"] == 1,
            process=process_state(h["pid"], h["process_start_ticks"], proc, boot=boot), comms=comms, links=links,
            records=recs, island=island, island_device=_cstr(device) if island else "",
            island_library=_cstr(library) if island else "", boot_id=boot, hangs_suspected=suspected,
            hangs_resolved=resolved,
            island_totals=IslandTotals({p: h[f"island_{p}_ns"] for p in ISLAND_PHASES}, h["island_chunks"],
                                       h["island_ops"]) if island else None)
    except struct.error as e:
        raise StatsError(f"{path}: malformed ({e})") from None
    finally:
        buf.close()
