"""Uneven splits that equalise step time: a data-parallel batch per rank, layers per pipeline stage.

Pure functions of measured times; nothing here reads a job (hetobs/plan/job.py does).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["split", "split_layers", "LayerSplit"]


def _positive(values: Sequence[float], what: str) -> list[float]:
    out = []
    for i, v in enumerate(values):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{what}[{i}] = {v!r}: expected a positive finite number")
        out.append(float(v))
    if not out:
        raise ValueError(f"{what}: expected at least one value")
    return out


def split(global_batch: int, seconds_per_sample: Sequence[float],
          max_batch: Sequence[int | None] | None = None) -> list[int]:
    """Integers summing to `global_batch` that minimise the slowest rank's compute time.

    Rank i computes a batch of b in `seconds_per_sample[i] * b`; the split minimises
    max_i(seconds_per_sample[i] * b_i) with b_i <= max_batch[i] (a memory cap; None:
    no cap). The real-valued optimum is proportional to speed (1 / seconds per sample);
    its floors are topped up one sample at a time to the rank that would finish
    soonest with it, which is the optimal integer split (and ties go to the lower rank,
    so every rank computes the same plan).
    """
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 0:
        raise ValueError(f"global_batch = {global_batch!r}: expected a non-negative integer")
    per = _positive(seconds_per_sample, "seconds_per_sample")
    caps: list[float] = [math.inf] * len(per)
    if max_batch is not None:
        if len(max_batch) != len(per):
            raise ValueError(f"max_batch has {len(max_batch)} entries for {len(per)} ranks")
        for i, c in enumerate(max_batch):
            if c is None:
                continue
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"max_batch[{i}] = {c!r}: expected a non-negative integer or None")
            caps[i] = c
    if sum(caps) < global_batch:
        raise ValueError(f"global_batch {global_batch} exceeds the ranks' max_batch total {int(sum(caps))}")
    speed_total = sum(1.0 / p for p in per)
    batch = [int(min(caps[i], math.floor(global_batch / p / speed_total))) for i, p in enumerate(per)]
    heap = [(p * (batch[i] + 1), i) for i, p in enumerate(per) if batch[i] < caps[i]]
    heapq.heapify(heap)
    for _ in range(global_batch - sum(batch)):
        _, i = heapq.heappop(heap)
        batch[i] += 1
        if batch[i] < caps[i]:
            heapq.heappush(heap, (per[i] * (batch[i] + 1), i))
    return batch


@dataclass(frozen=True)
class LayerSplit:
    """Layers per pipeline stage (contiguous, in order) and each stage's predicted time."""

    layers: list[int]
    stage_seconds: list[float]

    @property
    def bottleneck_seconds(self) -> float:
        """The slowest stage: a pipeline's steady-state time per micro-batch."""
        return max(self.stage_seconds)


def split_layers(layer_seconds: Sequence[float], stages: int,
                 stage_speed: Sequence[float] | None = None) -> LayerSplit:
    """Cut layers into `stages` contiguous runs minimising the slowest stage's time.

    `layer_seconds[l]`: layer l's time on a reference device; `stage_speed[s]`: how many
    times faster stage s's device runs (default 1 for all). Exact, by dynamic programming
    over prefix sums (O(stages x layers^2)). Every stage gets at least one layer.
    """
    times = _positive(layer_seconds, "layer_seconds")
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= len(times):
        raise ValueError(f"stages = {stages!r}: expected an integer from 1 to the number of layers ({len(times)})")
    speed = _positive(stage_speed, "stage_speed") if stage_speed is not None else [1.0] * stages
    if len(speed) != stages:
        raise ValueError(f"stage_speed has {len(speed)} entries for {stages} stages")
    n = len(times)
    prefix = [0.0]
    for t in times:
        prefix.append(prefix[-1] + t)
    # best[s][j]: the least bottleneck placing layers [0, j) on stages [0, s); cut[s][j] the start of stage s-1.
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n - (stages - s) + 1):
            for i in range(s - 1, j):
                cost = max(best[s - 1][i], (prefix[j] - prefix[i]) / speed[s - 1])
                if cost < best[s][j]:
                    best[s][j], cut[s][j] = cost, i
    bounds, j = [], n
    for s in range(stages, 0, -1):
        i = cut[s][j]
        bounds.append((i, j))
        j = i
    bounds.reverse()
    return LayerSplit([j - i for i, j in bounds],
                      [(prefix[j] - prefix[i]) / speed[s] for s, (i, j) in enumerate(bounds)])
