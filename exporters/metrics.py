"""Turn one `Snapshot` into metric families: the single function every exporter uses.

`families(snapshot)` is the only place that decides what a number means (state of a
rank, bandwidth of an op kind, age of a link). The Prometheus collector renders its
output as exposition families and the OpenTelemetry instruments report the very
same samples as observations, so the two exporters cannot disagree.

Everything is derived from counters the native core keeps in the stats segment;
nothing is remembered between snapshots (a restarted exporter serves the same
numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from hetobs import stats
from hetobs.codes import busbw_factor
from hetobs.plan.accounting import busy_share

from .naming import (ISLAND_PHASES, LINK_HEALTH_SERIES_PER_RANK, METRICS, RANK_STATES, SEGMENT_PROBLEMS, MetricSpec,
                     size_class)
from .source import RankEntry, Snapshot

__all__ = ["Family", "families", "busbw_factor", "rank_state", "seconds_since_progress", "LATENCY_LE", "LAG_LE",
           "BUSY_RECORDS"]

# Newest records per rank read for the busy share: 15 steps; each record read costs a scrape ~0.1 ms here.
BUSY_RECORDS = 16

Labels = tuple[str, ...]

# Cumulative bucket bounds of the duration histogram, as Prometheus `le` strings.
# Native bucket b counts ops shorter than 2**b µs; the last one is open-ended. Served
# at every other native bound (powers of 4, 1 µs .. 4 s): half the series, which keeps
# a 4-rank x 16-communicator scrape under its 50 ms budget (bench/scrape_bench.py),
# at a resolution still finer than the spread of collective times. The native busbw
# buckets are not served: busbw over any window is rate(bus_bytes) / rate(duration_sum).
_STEP = 2
LATENCY_LE: tuple[str, ...] = tuple(repr(2.0**b / 1e6) for b in range(0, stats.LATENCY_BUCKETS - 1, _STEP)) + ("+Inf",)
# The arrival lag histogram's bounds, served the same way (powers of 4, 1 µs .. 67 s).
LAG_LE: tuple[str, ...] = tuple(repr(2.0**b / 1e6) for b in range(0, stats.LAG_BUCKETS - 1, _STEP)) + ("+Inf",)


@dataclass
class Family:
    """Samples of one metric. Histogram samples are (labels, cumulative bucket counts, sum or None)."""

    spec: MetricSpec
    samples: list[tuple[Labels, float]] = field(default_factory=list)
    histograms: list[tuple[Labels, list[float], float | None]] = field(default_factory=list)


def seconds_since_progress(st: stats.RankStats, now_ns: int) -> float:
    return max(0.0, (now_ns - st.last_progress_ns) / 1e9)


def rank_state(st: stats.RankStats, now_ns: int) -> str:
    """healthy | suspect | stuck | stopped | dead | exited (see naming.RANK_STATES).

    Stuck: an op is in flight and nothing progressed for the hang timeout. Suspect:
    half of it, or a watchdog that stopped beating. An idle rank is never stuck: time
    between collectives is the application's business.
    """
    if st.exited_cleanly:
        return "exited"
    if st.stale:
        return "dead"
    age = seconds_since_progress(st, now_ns)
    inflight = any(c.inflight_record is not None for c in st.comms)
    timeout = st.hang_timeout_s if st.hang_timeout_s > 0 else float("inf")
    if inflight and age >= timeout:
        return "stuck"
    if st.process == "stopped":
        return "stopped"
    beat_age = (now_ns - st.heartbeat_ns) / 1e9
    if (inflight and age >= timeout / 2) or beat_age >= max(timeout, 5.0):
        return "suspect"
    return "healthy"


def _fams() -> dict[str, Family]:
    return {m.name: Family(m) for m in METRICS}


def _rank_metrics(f: dict[str, Family], job: str, e: RankEntry, now: int) -> None:
    rl: Labels = (job, str(e.rank), e.host)
    f["hetobs_rank_up"].samples.append((rl, 1.0 if e.live else 0.0))
    for p in SEGMENT_PROBLEMS:
        if e.problem == p:
            f["hetobs_segment_problem"].samples.append(((job, str(e.rank), p), 1.0))
    st = e.stats
    if st is None:
        if e.exited_cleanly:
            for s in RANK_STATES:
                f["hetobs_rank_state"].samples.append((rl + (s,), 1.0 if s == "exited" else 0.0))
        return
    state = rank_state(st, now)
    for s in RANK_STATES:
        f["hetobs_rank_state"].samples.append((rl + (s,), 1.0 if s == state else 0.0))
    f["hetobs_seconds_since_progress"].samples.append((rl, seconds_since_progress(st, now)))
    f["hetobs_heartbeat_age_seconds"].samples.append((rl, max(0.0, (now - st.heartbeat_ns) / 1e9)))
    f["hetobs_hang_timeout_seconds"].samples.append((rl, st.hang_timeout_s))
    f["hetobs_hangs_detected"].samples.append((rl, float(st.hangs_detected)))
    f["hetobs_hangs_suspected"].samples.append((rl, float(st.hangs_suspected)))
    f["hetobs_hangs_resolved"].samples.append((rl, float(st.hangs_resolved)))
    f["hetobs_dumps_written"].samples.append((rl, float(st.dumps_written)))
    if st.island_totals is not None:
        _island_metrics(f, (job, str(e.rank), st.island), st)
    share = busy_share(st.records, st.world_size) if st.records else None
    if share is not None:
        f["hetobs_rank_busy_share"].samples.append(((job, str(e.rank), st.island), share))
    jr: Labels = (job, str(e.rank))
    for c in st.comms:
        _comm_metrics(f, jr, c, now)
    for ln in st.links:
        _link_metrics(f, jr, ln, now)
    _link_health_metrics(f, jr, st.links)


def _island_metrics(f: dict[str, Family], il: Labels, st: stats.RankStats) -> None:
    t = st.island_totals
    assert t is not None
    f["hetobs_rank_island"].samples.append((il + (st.island_device or "unknown", st.island_library or "unknown"), 1.0))
    for phase in ISLAND_PHASES:
        f["hetobs_island_phase_seconds"].samples.append((il + (phase,), t.phase_ns[phase] / 1e9))
    f["hetobs_island_relay_chunks"].samples.append((il, float(t.chunks)))
    f["hetobs_island_ops"].samples.append((il, float(t.ops)))


def _comm_metrics(f: dict[str, Family], rl: Labels, c: stats.CommStats, now: int) -> None:
    cl = rl + (str(c.comm_id),)
    f["hetobs_inflight_ops"].samples.append((cl, 1.0 if c.inflight_record is not None else 0.0))
    if c.inflight_record is not None and c.inflight_op and c.inflight_start_ns:
        age = max(0.0, (now - c.inflight_start_ns) / 1e9)
        f["hetobs_inflight_op_seconds"].samples.append((cl + (c.inflight_op,), age))
    f["hetobs_collective_seq"].samples.append((cl, float(c.coll_seq)))
    f["hetobs_comm_failed"].samples.append((cl, 1.0 if c.failed else 0.0))
    a = c.arrivals
    if a is not None and a.judged:
        f["hetobs_last_arrivals"].samples.append((cl, float(a.last)))
        f["hetobs_arrivals_judged"].samples.append((cl, float(a.judged)))
        f["hetobs_arrival_lag_seconds"].histograms.append((cl, _cumulative(a.lag), a.lag_total_ns / 1e9))
    if c.digests_checked:
        f["hetobs_digests_checked"].samples.append((cl, float(c.digests_checked)))
        f["hetobs_data_mismatches"].samples.append((cl, float(c.data_mismatches or 0)))
    for op, k in c.ops.items():
        if not k.calls:
            continue
        ol = cl + (op,)
        f["hetobs_collectives"].samples.append((ol, float(k.calls)))
        f["hetobs_collective_bytes"].samples.append((ol, float(k.bytes)))
        f["hetobs_collective_bus_bytes"].samples.append((ol, k.bytes * busbw_factor(op, c.size)))
        f["hetobs_collective_errors"].samples.append((ol, float(k.errors)))
        f["hetobs_collective_duration_seconds"].histograms.append((ol, _cumulative(k.latency), k.total_ns / 1e9))
        if k.bytes and k.total_ns:
            algbw = k.bytes / (k.total_ns / 1e9)
            sl = ol + (size_class(k.bytes / k.calls),)
            f["hetobs_collective_algbw_bytes_per_second"].samples.append((sl, algbw))
            f["hetobs_collective_busbw_bytes_per_second"].samples.append((sl, algbw * busbw_factor(op, c.size)))


def _link_metrics(f: dict[str, Family], rl: Labels, ln: stats.LinkStats, now: int) -> None:
    ll = rl + (str(ln.comm_id), str(ln.global_peer), ln.transport)
    f["hetobs_link_bytes"].samples += [(ll + ("sent",), float(ln.bytes_sent)), (ll + ("recv",), float(ln.bytes_recv))]
    f["hetobs_link_busy_seconds"].samples.append((ll, ln.busy_ns / 1e9))
    if ln.busy_ns > 0:
        f["hetobs_link_bandwidth_bytes_per_second"].samples.append(
            (ll, (ln.bytes_sent + ln.bytes_recv) / (ln.busy_ns / 1e9)))
    f["hetobs_link_reconnects"].samples.append((ll, float(ln.reconnects)))
    if ln.last_activity_ns:
        f["hetobs_link_seconds_since_activity"].samples.append((ll, max(0.0, (now - ln.last_activity_ns) / 1e9)))


def _link_health_metrics(f: dict[str, Family], rl: Labels, links: Sequence[stats.LinkStats]) -> None:
    """TCP_INFO series for the rank's worst links only (naming.LINK_HEALTH_SERIES_PER_RANK)."""
    tcp = [ln for ln in links if ln.tcp is not None]
    tcp.sort(key=lambda ln: (ln.tcp["retransmits_total"], ln.tcp["rtt_us"]), reverse=True)  # type: ignore[index]
    for ln in tcp[:LINK_HEALTH_SERIES_PER_RANK]:
        t = ln.tcp
        assert t is not None
        ll = rl + (str(ln.comm_id), str(ln.global_peer), ln.transport)
        f["hetobs_link_rtt_seconds"].samples.append((ll, t["rtt_us"] / 1e6))
        f["hetobs_link_rtt_variance_seconds"].samples.append((ll, t["rttvar_us"] / 1e6))
        f["hetobs_link_retransmits"].samples.append((ll, float(t["retransmits_total"])))
        f["hetobs_link_unacked"].samples.append((ll, float(t["unacked"])))
        f["hetobs_link_lost"].samples.append((ll, float(t["lost"])))
        f["hetobs_link_delivery_rate_bytes_per_second"].samples.append((ll, float(t["delivery_rate_bps"])))


def _cumulative(buckets: Sequence[int]) -> list[float]:
    """Cumulative counts at the served bounds (every _STEP-th native bound, then +Inf)."""
    out, total = [], 0
    last = len(buckets) - 1
    for i, b in enumerate(buckets):
        total += b
        if i < last and i % _STEP == 0:
            out.append(float(total))
    out.append(float(total))
    return out


def families(snapshot: Snapshot) -> list[Family]:
    """Every family in naming.METRICS order, each present even when it has no samples."""
    f = _fams()
    for entry in snapshot.ranks:
        _rank_metrics(f, snapshot.job, entry, snapshot.time_ns)
    f["hetobs_exporter_snapshot_seconds"].samples.append(((snapshot.job,), snapshot.read_seconds))
    return list(f.values())
