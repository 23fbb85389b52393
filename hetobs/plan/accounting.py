"""Where each rank's time goes between and inside the collectives of its data-parallel communicator.

Definitions (docs/islands.md, "Balance"), over a window of consecutive collective
sequence ids s_0 .. s_N that every rank completed:

- compute: for m = 1..N, start(s_m) - end(s_{m-1}) (time outside collectives: the
  model's forward/backward, the optimizer, data loading; clamped at 0 where async
  ops overlap);
- inside: end(s_m) - start(s_m);
- wait: arrival skew, max over ranks of start(s_m) - this rank's start(s_m): the time
  this rank sat in the op before the last rank arrived (0 for the last arriver);
- transfer: inside - wait. The last arriver's time inside is the op's own cost, so
  the step's collective time is taken as min over ranks of inside, per op.

Starts and ends are wall-clock times of the rank's records: ranks on different hosts
need clocks in step (NTP/PTP) for `wait`; compute and inside are per-rank differences
and need no common clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Mapping, NamedTuple, Sequence

__all__ = ["OpTime", "RankTime", "Window", "account", "busy_share"]


class OpTime(NamedTuple):
    """One completed collective of a rank: sequence id, wall-clock start and end (ns), island phase time."""

    seq: int
    start_ns: int
    end_ns: int
    vendor_ns: int | None = None  # a hierarchical op's time in the island's own library (None: not an island op)


@dataclass(frozen=True)
class RankTime:
    """One rank's totals over the window (ns), and the share of time it computed."""

    rank: int
    intervals: int
    compute_ns: int
    inside_ns: int
    wait_ns: int
    vendor_ns: int | None

    @property
    def transfer_ns(self) -> int:
        return self.inside_ns - self.wait_ns

    @property
    def busy_share(self) -> float:
        """compute / (compute + inside): 1 for a rank that never waits on a collective."""
        total = self.compute_ns + self.inside_ns
        return self.compute_ns / total if total else 0.0

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "intervals": self.intervals, "compute_s": self.compute_ns / 1e9,
                "inside_s": self.inside_ns / 1e9, "wait_s": self.wait_ns / 1e9,
                "transfer_s": self.transfer_ns / 1e9, "busy_share": round(self.busy_share, 4)}


@dataclass(frozen=True)
class Window:
    """The accounting of every rank over one common window of sequence ids."""

    first_seq: int
    last_seq: int
    ranks: dict[int, RankTime]
    collective_ns: int  # sum over the window's ops of min over ranks of time inside

    @property
    def intervals(self) -> int:
        return self.last_seq - self.first_seq


def account(ops: Mapping[int, Sequence[OpTime]], last: int = 0) -> Window | None:
    """Account every rank over the longest run of consecutive sequence ids all ranks completed.

    `ops[rank]`: that rank's completed collectives on the data-parallel communicator.
    `last`: keep only the newest `last` intervals (0: all). None when fewer than two
    consecutive sequence ids are common to every rank (nothing to measure yet).
    """
    if not ops:
        return None
    by_rank = {r: {o.seq: o for o in v if o.end_ns >= o.start_ns > 0} for r, v in ops.items()}
    common = set.intersection(*(set(m) for m in by_rank.values()))
    if not common:
        return None
    # the newest run of consecutive ids (older ones may have gaps where a ring overwrote)
    seqs = sorted(common)
    end = len(seqs) - 1
    begin = end
    while begin > 0 and seqs[begin - 1] == seqs[begin] - 1:
        begin -= 1
    run = seqs[begin:end + 1]
    if last > 0:
        run = run[-(last + 1):]
    if len(run) < 2:
        return None
    ranks = sorted(by_rank)
    compute = dict.fromkeys(ranks, 0)
    inside = dict.fromkeys(ranks, 0)
    wait = dict.fromkeys(ranks, 0)
    vendor: dict[int, int | None] = dict.fromkeys(ranks, 0)
    collective = 0
    for prev, seq in pairwise(run):
        latest = max(by_rank[r][seq].start_ns for r in ranks)
        collective += min(by_rank[r][seq].end_ns - by_rank[r][seq].start_ns for r in ranks)
        for r in ranks:
            op, before = by_rank[r][seq], by_rank[r][prev]
            compute[r] += max(0, op.start_ns - before.end_ns)
            here = op.end_ns - op.start_ns
            inside[r] += here
            wait[r] += min(here, max(0, latest - op.start_ns))
            v = vendor[r]
            vendor[r] = None if v is None or op.vendor_ns is None else v + op.vendor_ns
    n = len(run) - 1
    return Window(run[0], run[-1], {r: RankTime(r, n, compute[r], inside[r], wait[r], vendor[r]) for r in ranks},
                  collective)


def busy_share(records: Sequence[Mapping[str, object]], world_size: int) -> float | None:
    """One rank's compute share over its newest records (stats-segment dicts), without the other ranks.

    compute / (compute + inside) over consecutive collectives of its data-parallel
    communicator (size = world, hierarchical preferred, else the busiest); None when
    fewer than two consecutive collectives were recorded. What `hetobs top` and the
    exporter show: an island whose share sits far below the others' waits for them.
    """
    comms: dict[object, tuple[bool, dict[int, OpTime]]] = {}
    for rec in records:
        seq, start, end = rec.get("collective_seq_id"), rec.get("time_discovered_started_ns"), \
            rec.get("time_discovered_completed_ns")
        if rec.get("state") != "completed" or not isinstance(seq, int) or not seq or not isinstance(start, int) \
                or not isinstance(end, int) or not start or end < start or rec.get("comm_size") != world_size:
            continue
        island, ops = comms.get(rec.get("comm_id"), (False, {}))
        ops[seq] = OpTime(seq, start, end)
        comms[rec.get("comm_id")] = (island or bool(rec.get("island")), ops)
    if not comms:
        return None
    _, ops = max(comms.values(), key=lambda v: (v[0], len(v[1])))
    compute = inside = 0
    for seq in sorted(ops):
        prev = ops.get(seq - 1)
        if prev is None:
            continue
        compute += max(0, ops[seq].start_ns - prev.end_ns)
        inside += ops[seq].end_ns - ops[seq].start_ns
    total = compute + inside
    return compute / total if total else None
