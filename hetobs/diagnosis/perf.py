"""Stage 4b, healthy but slow: stragglers from arrival skew, slow links from bandwidth outliers.

Advisory only (a slow job that progresses is healthy): these verdicts never make the
status "fault". Both tests are built to stay quiet on noise:
- straggler: over the last records of a communicator, a rank must arrive late at
  (nearly) every collective, by a margin that is large next to the spread of the
  other ranks, *and* spend correspondingly less time inside the op (it is the one the
  others wait for). The second condition is what tells a straggler from a host whose
  wall clock is merely offset: clock skew shifts arrival, not time spent waiting;
- slow link: a link's bytes over busy time far below the median of the links of the
  same transport, and only when such links are rare (a wide spread is not an outlier).
"""

from __future__ import annotations

import statistics
from typing import Any

from .confidence import confidence
from .job import LoadedJob
from .types import CommKey, Verdict, VerdictKind

__all__ = ["straggler_verdicts", "slow_link_verdicts"]

MIN_LATE_S = 0.002  # below this arrival skew nobody cares
MIN_SEQS = 4
MIN_LINK_BYTES = 1 << 20


def straggler_verdicts(job: LoadedJob) -> list[Verdict]:
    comms: set[CommKey] = set()
    for d in job.dumps.values():
        comms.update(d.comms)
    out: list[Verdict] = []
    for comm in sorted(comms, key=str):
        out.extend(_stragglers(job, comm))
    return out


def _stragglers(job: LoadedJob, comm: CommKey) -> list[Verdict]:
    starts: dict[int, dict[int, tuple[int, int]]] = {}
    seq_count: dict[int, int] = {}
    for r, d in job.dumps.items():
        v = d.comms.get(comm)
        if v is None:
            continue
        mine = {rec.seq: (rec.started_ns, rec.completed_ns) for rec in v.recent
                if rec.seq and rec.started_ns and rec.completed_ns and rec.state == "completed"}
        if mine:
            starts[r] = mine
            for s in mine:
                seq_count[s] = seq_count.get(s, 0) + 1
    if len(starts) < 3:
        return []
    need = max(3, int(0.9 * len(starts)))
    seqs = sorted(s for s, n in seq_count.items() if n >= need)[-16:]
    if len(seqs) < MIN_SEQS:
        return []
    import numpy as np  # here, not at module level: keeps `hetobs diagnose` start-up ~0.2 s shorter

    ranks = sorted(starts)
    t0 = np.full((len(ranks), len(seqs)), np.nan)
    t1 = np.full((len(ranks), len(seqs)), np.nan)
    for i, r in enumerate(ranks):
        row = starts[r]
        for j, s in enumerate(seqs):
            se = row.get(s)
            if se is not None:
                t0[i, j], t1[i, j] = se
    late = (t0 - np.nanmedian(t0, axis=0)) / 1e9  # seconds after the median arrival, per seq
    dur = (t1 - t0) / 1e9
    with np.errstate(all="ignore"):
        med_late = np.nanmedian(late, axis=1)
        med_dur = np.nanmedian(dur, axis=1)
        spread = np.nanmedian(np.abs(med_late - np.nanmedian(med_late)))
        typical_dur = float(np.nanmedian(med_dur))
        frac_late = np.nanmean(late > np.maximum(MIN_LATE_S, 0.5 * med_late[:, None]), axis=1)
        mean_late = np.nanmean(late, axis=1)
        last_share = np.mean(np.nanargmax(np.where(np.isnan(t0), -np.inf, t0), axis=0)[None, :]
                             == np.arange(len(ranks))[:, None], axis=1)
    margin = max(MIN_LATE_S, 10.0 * float(spread))
    out = []
    flagged = [i for i in range(len(ranks))
               if med_late[i] > margin and frac_late[i] >= 0.75
               and med_dur[i] < typical_dur - 0.5 * med_late[i]]
    if not flagged or len(flagged) > max(1, len(ranks) // 4):
        return []
    for i in flagged:
        r = ranks[i]
        ev = [f"rank {r} arrived a median {med_late[i] * 1e3:.1f} ms after the others at the last {len(seqs)} "
              f"collectives on comm {comm} (late at {frac_late[i]:.0%} of them; others' spread "
              f"{float(spread) * 1e3:.2f} ms)",
              f"mean lateness {mean_late[i] * 1e3:.1f} ms; it arrived last at {last_share[i]:.0%} of the "
              f"{len(seqs)} ops",
              f"its ops took a median {med_dur[i] * 1e3:.1f} ms against {typical_dur * 1e3:.1f} ms for the others: "
              f"they wait for it (so this is not clock skew)"]
        hosts = {job.host_of(x) for x in ranks}
        if len(hosts) > 1:
            ev.append("ranks span several hosts: arrival times compare wall clocks across hosts")
        out.append(Verdict(VerdictKind.STRAGGLER, [r], f"rank {r} is a straggler on comm {comm}: the others wait "
                           f"~{med_late[i] * 1e3:.0f} ms for it at each collective", ev, comm=comm,
                           seq=seqs[-1], confidence=confidence(VerdictKind.STRAGGLER, "arrives_late")))
    return out


def slow_link_verdicts(job: LoadedJob) -> list[Verdict]:
    rows: list[tuple[Any, int, int, float, int, int]] = []  # transport, src, dst, GB/s, bytes, busy
    for r, d in job.dumps.items():
        for v in d.comms.values():
            for lk in v.links:
                if lk.bytes_sent and lk.busy_ns and lk.bytes_sent >= MIN_LINK_BYTES:
                    rows.append((lk.transport, r, lk.peer, lk.bytes_sent / lk.busy_ns, lk.bytes_sent, lk.busy_ns))
    out: list[Verdict] = []
    by_transport: dict[Any, list[tuple[Any, int, int, float, int, int]]] = {}
    for row in rows:
        by_transport.setdefault(row[0], []).append(row)
    for transport, links in sorted(by_transport.items(), key=lambda kv: str(kv[0])):
        if len(links) < 4:
            continue
        med = statistics.median(x[3] for x in links)
        slow = [x for x in links if x[3] < 0.25 * med]
        if not slow or len(slow) > max(1, len(links) // 10):
            continue
        for _, src, dst, gbs, nbytes, busy in slow:
            ev = [f"link {src} -> {dst} ({transport}) moved {nbytes} bytes in {busy / 1e9:.3f} s busy: {gbs:.3f} GB/s",
                  f"median of {len(links)} {transport} links: {med:.3f} GB/s ({gbs / med:.0%} of it)"]
            out.append(Verdict(VerdictKind.SLOW_LINK, [], f"link {src} -> {dst} is slow: {gbs:.3f} GB/s against a "
                               f"median {med:.3f} GB/s", ev, links=[(src, dst)],
                               confidence=confidence(VerdictKind.SLOW_LINK, "bandwidth_outlier")))
    return out
