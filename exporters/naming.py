"""Every metric name, unit, type and label set the exporters serve, in one place.

Dashboards, alert rules, the OpenTelemetry instruments and the tests all take names
from here, so a rename is one edit and `monitoring/` cannot drift unnoticed (a test
checks every name used there against `served_names()`).

Label rules: every label set is bounded by the job's shape — job id, rank, host,
communicator, op kind, peer, direction, transport, a message-size class, a state,
a rank's island and a phase of the fixed set `ISLAND_PHASES` —
never a sequence id, record id, pid or timestamp, which would make a new series per
op. TCP link health (hetobs_link_rtt_seconds, ...) adds a further cap: a rank serves it
for at most LINK_HEALTH_SERIES_PER_RANK links, its worst (most retransmits, then highest
rtt), so a rank connected to thousands of peers adds a fixed number of series.

Why `job_id` and not `job`: Prometheus attaches its own `job` label (the scrape
job) to every series; an exporter label of that name would be renamed
`exported_job` on ingestion, which is a trap for every query written against it.

Why the island is an info gauge (`hetobs_rank_island`) and not a label on every
per-rank series: adding a label to `hetobs_seconds_since_progress` or the per-op
counters would change their series (the names others rely on) for every job,
heterogeneous or not. Join it where wanted: `... * on (job_id, rank)
group_left(island) hetobs_rank_island`.

Why the message-size class (`msg_size`) sits on the bandwidth gauges only: it is
derived from bytes / calls of an op kind (the stats segment has no per-size
counters), so it can move from one class to the next as calls accumulate. On a
gauge that is harmless; on a counter it would split one monotonic series into two
and break `rate()`. The classes follow NCCL Inspector's idea of grouping
collectives by message size, in powers of 4 from 1 KiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetobs.stats import ISLAND_PHASES  # phases of a hierarchical op with a busy-time counter

__all__ = [
    "MetricSpec", "METRICS", "BY_NAME", "served_names", "otel_name", "otel_unit", "size_class", "SIZE_CLASSES",
    "RANK_STATES", "SEGMENT_PROBLEMS",
    "LINK_HEALTH_SERIES_PER_RANK", "RANK", "COMM", "OP", "LINK", "ISLAND", "ISLAND_PHASES",
]

# Label sets (order is the order of label values in every sample). `host` sits on the
# per-rank series only: a rank lives on one host, so per-communicator, per-op and
# per-link series join it `on (job_id, rank)` when needed; one label less on the many
# series keeps a scrape fast (prometheus_client's exposition cost grows per label).
RANK = ("job_id", "rank", "host")
COMM = ("job_id", "rank", "comm")
OP = COMM + ("op",)
LINK = COMM + ("peer", "transport")
ISLAND = ("job_id", "rank", "island")  # per rank: a rank is in one island
ISLAND_INFO = ISLAND + ("device", "library")  # the info gauge also names the island's device and library


# Links per rank that serve TCP health series (the worst ones; see the label rules above).
LINK_HEALTH_SERIES_PER_RANK = 8

# Per-rank state (hetobs_rank_state{state=...} is 1 for the current one, 0 for the others).
RANK_STATES = ("healthy", "suspect", "stuck", "stopped", "dead", "exited")
# Why a rank's segment could not be used (hetobs_segment_problem{problem=...}).
SEGMENT_PROBLEMS = ("version", "foreign", "truncated", "unreadable", "vanished")

_KIB = 1024
# (upper bound in bytes, label); the last class is open-ended.
SIZE_CLASSES: tuple[tuple[float, str], ...] = (
    (0, "0"), (_KIB, "le1KiB"), (16 * _KIB, "le16KiB"), (256 * _KIB, "le256KiB"), (4 * _KIB**2, "le4MiB"),
    (64 * _KIB**2, "le64MiB"), (_KIB**3, "le1GiB"), (float("inf"), "gt1GiB"),
)


def size_class(message_bytes: float) -> str:
    """The bounded message-size label for a mean message size in bytes."""
    for bound, label in SIZE_CLASSES:
        if message_bytes <= bound:
            return label
    return SIZE_CLASSES[-1][1]


@dataclass(frozen=True)
class MetricSpec:
    """One metric family. `name` is the base name (counters are served with `_total`)."""

    name: str
    kind: str  # counter | gauge | histogram
    unit: str  # Prometheus unit suffix ('' when none)
    labels: tuple[str, ...]
    help: str
    otel_unit: str = ""  # UCUM unit when the name carries no unit suffix (hetobs_seconds_since_progress)

    @property
    def samples(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for this family."""
        if self.kind == "counter":
            return (self.name + "_total",)
        if self.kind == "histogram":
            return (self.name + "_bucket", self.name + "_count", self.name + "_sum")
        return (self.name,)


def _m(name: str, kind: str, unit: str, labels: tuple[str, ...], help: str, **kw: object) -> MetricSpec:
    return MetricSpec(name, kind, unit, labels, help, **kw)  # type: ignore[arg-type]


METRICS: tuple[MetricSpec, ...] = (
    # --- reachability and health, one series per rank --------------------------------------
    _m("hetobs_rank_up", "gauge", "", RANK,
       "1 when the rank's stats segment was read and its process lives (running or stopped), else 0."),
    _m("hetobs_segment_problem", "gauge", "", ("job_id", "rank", "problem"),
       "1 when the rank's stats segment cannot be used: version, foreign, truncated, unreadable or vanished."),
    _m("hetobs_rank_state", "gauge", "", RANK + ("state",),
       "1 for the rank's current state: healthy, suspect, stuck (no progress in an op past the hang timeout), "
       "stopped, dead or exited."),
    _m("hetobs_seconds_since_progress", "gauge", "", RANK,
       "Seconds since the rank's last completed op or progress step (the hang gauge).", otel_unit="s"),
    _m("hetobs_heartbeat_age_seconds", "gauge", "seconds", RANK,
       "Seconds since the rank's watchdog last beat; grows when the process is stopped or dead."),
    _m("hetobs_hang_timeout_seconds", "gauge", "seconds", RANK,
       "The rank's HETOBS_HANG_TIMEOUT: seconds without progress in an op before the watchdog dumps."),
    _m("hetobs_hangs_detected", "counter", "", RANK, "Hangs the rank's watchdog detected."),
    _m("hetobs_hangs_suspected", "counter", "", RANK,
       "Suspected hangs the rank's watchdog dumped early: an op without progress far longer than its "
       "communicator's history (HETOBS_SUSPECT_*); the job is not touched."),
    _m("hetobs_hangs_resolved", "counter", "", RANK,
       "Suspected hangs whose op then completed on this rank: slow, not hung (the incident is marked resolved)."),
    _m("hetobs_dumps_written", "counter", "", RANK, "Dumps the rank wrote (hang, error, on demand, signal)."),
    # --- per communicator ------------------------------------------------------------------
    _m("hetobs_inflight_ops", "gauge", "", COMM, "1 while an op runs on this communicator, else 0."),
    _m("hetobs_inflight_op_seconds", "gauge", "seconds", OP,
       "Age of the op running on this communicator (present only while one runs)."),
    _m("hetobs_collective_seq", "gauge", "", COMM,
       "Last collective sequence id issued on this communicator (ranks behind the others stand out)."),
    _m("hetobs_comm_failed", "gauge", "", COMM, "1 once an op on this communicator failed (it is aborted)."),
    # --- per communicator and op kind -------------------------------------------------------
    _m("hetobs_collectives", "counter", "", OP, "Ops finished (completed or failed)."),
    _m("hetobs_collective_bytes", "counter", "bytes", OP,
       "Message bytes of finished ops, sized as nccl-tests does (all_gather: the gathered size)."),
    _m("hetobs_collective_bus_bytes", "counter", "bytes", OP,
       "Message bytes x the op's nccl-tests busbw factor: rate() of it over rate() of "
       "hetobs_collective_duration_seconds_sum is busbw over any window."),
    _m("hetobs_collective_errors", "counter", "", OP, "Ops that failed."),
    _m("hetobs_collective_duration_seconds", "histogram", "seconds", OP,
       "Op duration (buckets at powers of four microseconds, 1 µs .. 4 s)."),
    _m("hetobs_collective_algbw_bytes_per_second", "gauge", "bytes_per_second", OP + ("msg_size",),
       "Algorithm bandwidth over the op kind's lifetime: bytes / time in ops."),
    _m("hetobs_collective_busbw_bytes_per_second", "gauge", "bytes_per_second", OP + ("msg_size",),
       "Bus bandwidth as nccl-tests defines it: algbw x the op's factor (allreduce 2(n-1)/n, ...)."),
    # --- who arrives last (record/arrival.h), per communicator ---------------------------------
    _m("hetobs_last_arrivals", "counter", "", COMM,
       "Collectives this rank entered last (of those judged: every rank's entry reached it). Each op counts on "
       "exactly one rank, so a rank's share of the communicator's sum says how often it holds the others up: "
       "a straggler's share stands out."),
    _m("hetobs_arrivals_judged", "counter", "", COMM,
       "Collectives whose every rank's entry reached this rank (all_reduce, all_gather, reduce_scatter, "
       "barrier, all_to_all of the native transport; not broadcast or reduce, whose chain carries it one way)."),
    _m("hetobs_arrival_lag_seconds", "histogram", "seconds", COMM,
       "How far behind the first rank this rank entered the collectives it entered last (buckets at powers "
       "of four microseconds, 1 µs .. 67 s)."),
    # --- result digests (HETOBS_DIGEST), per communicator --------------------------------------
    _m("hetobs_digests_checked", "counter", "", COMM,
       "Sampled all_reduce, all_gather and broadcast results whose digests the ranks compared (HETOBS_DIGEST)."),
    _m("hetobs_data_mismatches", "counter", "", COMM,
       "Compared results where this rank's copy differed from the majority's: silent data corruption on this "
       "rank (the op, seq and first differing element are in its data_mismatch dump)."),
    # --- per link (communicator, peer) ------------------------------------------------------
    _m("hetobs_link_bytes", "counter", "bytes", LINK + ("direction",), "Bytes moved over the link, per direction."),
    _m("hetobs_link_busy_seconds", "counter", "seconds", LINK, "Time with a transfer pending on the link."),
    _m("hetobs_link_bandwidth_bytes_per_second", "gauge", "bytes_per_second", LINK,
       "Network bandwidth of the link: bytes (both directions) over busy time; separate from busbw."),
    _m("hetobs_link_seconds_since_activity", "gauge", "", LINK,
       "Seconds since the last byte moved over the link (absent if none ever did).", otel_unit="s"),
    _m("hetobs_link_reconnects", "counter", "", LINK,
       "Times the link's TCP connection broke and was re-made (the op resumed; HETOBS_RECONNECT_TIMEOUT)."),
    # --- per TCP link: the kernel's TCP_INFO, for at most LINK_HEALTH_SERIES_PER_RANK links a rank ---
    _m("hetobs_link_rtt_seconds", "gauge", "seconds", LINK, "Smoothed round-trip time of the link's TCP connection."),
    _m("hetobs_link_rtt_variance_seconds", "gauge", "seconds", LINK, "Round-trip time variance (the kernel's rttvar)."),
    _m("hetobs_link_retransmits", "counter", "", LINK, "TCP segments retransmitted on the link's connection."),
    _m("hetobs_link_unacked", "gauge", "", LINK, "TCP segments in flight and not yet acknowledged."),
    _m("hetobs_link_lost", "gauge", "", LINK, "TCP segments the kernel presumes lost now."),
    _m("hetobs_link_delivery_rate_bytes_per_second", "gauge", "bytes_per_second", LINK,
       "The kernel's latest delivery-rate estimate for the connection."),
    # --- islands: hierarchical ops of heterogeneous jobs (ranks that run them only) ---------------
    _m("hetobs_rank_island", "gauge", "", ISLAND_INFO,
       "1 for the rank's island, with the island's device type and collective library; join it onto per-rank "
       "series on (job_id, rank) with group_left(island, device, library)."),
    _m("hetobs_island_phase_seconds", "counter", "seconds", ISLAND + ("phase",),
       "Busy time of each phase of the rank's hierarchical ops: vendor (the island's own collective), d2h, "
       "wire, h2d (the host relay between islands; pipelined, so these overlap)."),
    _m("hetobs_island_relay_chunks", "counter", "", ISLAND, "Chunks the rank's hierarchical ops relayed."),
    _m("hetobs_island_ops", "counter", "", ISLAND,
       "Hierarchical ops the rank finished: rate(phase seconds) / rate(this) is a phase's time per op."),
    _m("hetobs_rank_busy_share", "gauge", "", ISLAND,
       "Share of the rank's time spent computing between collectives of its data-parallel communicator "
       "(compute / (compute + time inside), newest records): an island far below the others waits for them "
       "(hetobs plan balances it)."),
    # --- the exporter itself -------------------------------------------------------------------
    _m("hetobs_exporter_snapshot_seconds", "gauge", "seconds", ("job_id",),
       "Time this scrape spent reading the job's stats segments."),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def served_names() -> set[str]:
    """Every sample name a scrape can contain (what PromQL may refer to)."""
    return {s for m in METRICS for s in m.samples}


_OTEL_UNITS = {"seconds": "s", "bytes": "By", "bytes_per_second": "By/s", "": "1"}


def otel_name(spec: MetricSpec) -> str:
    """The OpenTelemetry instrument name: the Prometheus base name, so both read the same."""
    return spec.name


def otel_unit(spec: MetricSpec) -> str:
    """UCUM unit for OpenTelemetry."""
    return spec.otel_unit or _OTEL_UNITS[spec.unit]
