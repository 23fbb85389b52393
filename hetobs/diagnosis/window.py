"""`hetobs diagnose --window SECONDS`: advisories for a crawling (live, progressing) job.

The job is judged on a fresh on-demand dump, restricted to its last `window_s` seconds:
- `straggler`: perf.py's arrival-skew rule, fed only the ops that completed inside the
  window (so an old, cured hiccup is not reported);
- `slow_link`: TCP links whose round-trip time or delivery rate at the dump stands out. The kernel's
  smoothed rtt weighs the last round trips, so it describes the window's end. Only the
  ends that send data count (at least `MIN_SENT_BYTES` so far and some inside the window):
  an end that sends only small acknowledgement frames measures the peer's delayed acks,
  tens of ms on a healthy link. Rule (chosen to stay quiet on noise):
  per rank pair the larger rtt of its sending ends; a pair is slow when its rtt is at least
  `RTT_FACTOR` x the best pair's *and* `MIN_RTT_GAP_MS` above it, with at least
  `MIN_PAIRS` pairs measured and at least one pair not slow. Comparing with the best
  pair (not the median) matters: a host rate-limited far below the others slows every
  pair it is in, which is most pairs of a small job. A slow pair is named by its slowest
  sending end (src -> dst); when several slow pairs share one rank, src is that rank.
  Bandwidth, likewise: per pair the lowest delivery rate (the kernel's estimate) of its
  sending ends; slow at 1/`RATE_FACTOR` of the best pair's or less *and* an rtt at least
  `RATE_RTT_GAP_MS` above the best (one rate sample can be low on a healthy link at an
  app-limited moment; a rate-limited link queues, so its rtt rises as well) -- or a sample
  the kernel marks as not app-limited (`rate_app_limited` 0: it measured the path).
Both verdicts are advisory: a crawling job is healthy (exit 0) unless a fault is found.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Optional

from .confidence import confidence
from .job import LoadedJob
from .perf import straggler_verdicts
from .summary import TcpHealth
from .types import Verdict, VerdictKind

__all__ = ["window_verdicts", "in_window", "RTT_FACTOR", "MIN_RTT_GAP_MS", "MIN_PAIRS", "RATE_FACTOR",
           "RATE_RTT_GAP_MS", "WINDOW_RECORDS"]

RTT_FACTOR = 8.0
MIN_RTT_GAP_MS = 20.0
MIN_PAIRS = 3
RATE_FACTOR = 20.0
RATE_RTT_GAP_MS = 5.0  # the queueing a rate-limited link shows at least, for a low rate to count
MIN_SENT_BYTES = 1 << 20
WINDOW_RECORDS = 512  # op records read per rank and communicator when judging a window


def in_window(job: LoadedJob, window_s: float) -> LoadedJob:
    """A shallow copy of `job` whose op records are those completed in the window before each dump."""
    out = copy.copy(job)
    out.dumps = {}
    for r, d in job.dumps.items():
        end = d.time_ns or job.incident_time_ns
        if end is None:
            continue
        start = end - int(window_s * 1e9)
        comms = {c: dataclasses.replace(v, recent=[x for x in v.recent if x.completed_ns and x.completed_ns >= start])
                 for c, v in d.comms.items()}
        out.dumps[r] = dataclasses.replace(d, comms=comms)
    return out


def window_verdicts(job: LoadedJob, window_s: float) -> list[Verdict]:
    recent = in_window(job, window_s)
    out = straggler_verdicts(recent)
    for v in out:
        v.evidence.insert(0, f"judged on the ops that completed in the last {window_s:g} s before the dump")
    out.extend(_slow_links(job, window_s))
    return out


def _pairs(job: LoadedJob, window_s: float) -> dict[tuple[int, int], list[tuple[int, int, TcpHealth]]]:
    """Rank pair (low, high) -> the TCP ends measured on it (src, dst, health) that sent in the window."""
    pairs: dict[tuple[int, int], list[tuple[int, int, TcpHealth]]] = {}
    for r, d in job.dumps.items():
        seen: set[int] = set()
        for v in d.comms.values():
            for lk in v.links:
                t = lk.tcp
                if t is None or t.rtt_us is None or lk.peer in seen or lk.peer == r:
                    continue
                if lk.bytes_sent is None or lk.bytes_sent < MIN_SENT_BYTES:
                    continue
                if t.ms_since_data_sent is not None and t.ms_since_data_sent > window_s * 1e3:
                    continue
                seen.add(lk.peer)
                pairs.setdefault((min(r, lk.peer), max(r, lk.peer)), []).append((r, lk.peer, t))
    return pairs


def _slow_links(job: LoadedJob, window_s: float) -> list[Verdict]:
    pairs = _pairs(job, window_s)
    if len(pairs) < MIN_PAIRS:
        return []
    rtt_ms = {p: max(t.rtt_us or 0 for _, _, t in ends) / 1e3 for p, ends in pairs.items()}
    rate = {p: min(t.delivery_rate_bps or 0 for _, _, t in ends) for p, ends in pairs.items()}
    best, best_rate = min(rtt_ms.values()), max(rate.values())
    by_rtt = {p for p, x in rtt_ms.items() if x >= RTT_FACTOR * max(best, 0.001) and x >= best + MIN_RTT_GAP_MS}
    # A single delivery-rate sample can be low on a healthy link (an app-limited moment); a link that is
    # really rate-limited also queues, so its rtt rises too: both are required.
    # A sample the kernel took while the sender was not app-limited measured the path itself:
    # that alone is enough (a rate-limited sender keeps its queue full; its rtt at the dump
    # depends on where in the queue's cycle the sample fell).
    measured = {p for p, ends in pairs.items()
                if any(t.rate_app_limited == 0 and t.delivery_rate_bps == rate[p] for _, _, t in ends)}
    by_rate = {p for p, x in rate.items() if best_rate > 0 and x * RATE_FACTOR <= best_rate
               and (rtt_ms[p] >= best + RATE_RTT_GAP_MS or p in measured)}
    slow = by_rtt | by_rate
    if not slow or len(slow) == len(pairs):
        return []
    common = set.intersection(*(set(p) for p in slow))
    shared: Optional[int] = min(common) if len(common) == 1 and len(slow) > 1 else None
    out: list[Verdict] = []
    for p in sorted(slow):
        if p in by_rate:
            worst = min(pairs[p], key=lambda e: e[2].delivery_rate_bps or 0)
        else:
            worst = max(pairs[p], key=lambda e: e[2].rtt_us or 0)
        src = shared if shared is not None else worst[0]
        dst = p[1] if p[0] == src else p[0]
        ev = []
        if p in by_rate:
            ev.append(f"delivery rate of rank {worst[0]}'s data to rank {worst[1]}: {rate[p] / 1e6:.2f} MB/s against "
                      f"{best_rate / 1e6:.1f} MB/s on the best of {len(pairs)} measured rank pairs, with rtt "
                      f"{rtt_ms[p]:.1f} ms against {best:.2f} ms; a pair is slow at <= 1/{RATE_FACTOR:g} of the best "
                      f"rate and >= {RATE_RTT_GAP_MS:g} ms more rtt, or a rate sample the kernel took while the "
                      f"sender was not app-limited" + (" (this one was)" if p in measured else ""))
        if p in by_rtt:
            ev.append(f"rtt of the {src} <-> {dst} TCP connection: {rtt_ms[p]:.1f} ms against {best:.2f} ms on the "
                      f"best of {len(pairs)} measured rank pairs; a pair is slow at >= {RTT_FACTOR:g}x the best and "
                      f">= {MIN_RTT_GAP_MS:g} ms above it")
        for a, b, t in sorted(pairs[p], key=lambda e: e[0]):
            ev.append(f"TCP at rank {a} sending to rank {b}: rtt {(t.rtt_us or 0) / 1e3:.2f} ms "
                      f"(variance {(t.rttvar_us or 0) / 1e3:.2f} ms), delivery rate "
                      f"{(t.delivery_rate_bps or 0) / 1e6:.2f} MB/s, {t.retransmits_total} retransmitted segment(s)")
        if shared is not None:
            ev.append(f"every slow pair includes rank {shared} (host {job.host_of(shared) or '?'}): its network "
                      f"is the common factor")
        what = f"{rate[p] / 1e6:.2f} MB/s delivered" if p in by_rate else f"rtt {rtt_ms[p]:.1f} ms"
        out.append(Verdict(VerdictKind.SLOW_LINK, [], f"link {src} -> {dst} is slow: {what}, far from the best "
                           f"link ({best_rate / 1e6:.0f} MB/s, rtt {best:.2f} ms)", ev, links=[(src, dst)],
                           confidence=confidence(VerdictKind.SLOW_LINK, "tcp_outlier")))
    return out
