"""Predicted step time and mixed efficiency (eta_mix) of a split, from one accounting window.

The model, per step (one interval between collectives of the data-parallel
communicator): rank i computes b_i samples in p_i * b_i (p_i: its measured compute per
step over its current batch), then the collective takes T_x (the last arriver's time
inside, accounting.py). A step lasts max_i(p_i * b_i) + T_x, and the job's throughput
is B / step.

eta_mix = mixed throughput / sum over islands of each island's standalone throughput,
an island alone being its own ranks at the even split's per-rank batch B / world, with
its own library inside: its collective costs the island ops' vendor time (the phase
the records carry), nothing for a one-rank island, and T_x where the records carry no
phases (a non-island backend: then every rank counts as its own island, see job.py).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .accounting import Window
from .split import split

__all__ = ["PlanError", "build_plan"]


class PlanError(ValueError):
    """The job's records cannot support a plan (nothing measured, a rank that never computes, ...)."""


def build_plan(window: Window, islands: Mapping[int, str], current: Mapping[int, float], global_batch: int,
               max_batch: int | Sequence[int | None] | None = None) -> dict[str, Any]:
    """The plan document (without job/source, which the caller adds). `max_batch`: one cap for all, or per rank."""
    ranks = sorted(window.ranks)
    n = window.intervals
    per_sample: dict[int, float] = {}
    for r in ranks:
        t = window.ranks[r]
        if current[r] <= 0:
            raise PlanError(f"rank {r}: reported batch {current[r]}: cannot measure its time per sample")
        if t.compute_ns <= 0:
            raise PlanError(f"rank {r}: no time computing between collectives over seqs {window.first_seq}.."
                            f"{window.last_seq}: nothing to balance")
        per_sample[r] = t.compute_ns / n / 1e9 / current[r]
    collective_s = window.collective_ns / n / 1e9
    even = global_batch / len(ranks)
    caps = [max_batch] * len(ranks) if isinstance(max_batch, int) else max_batch
    try:
        planned = split(global_batch, [per_sample[r] for r in ranks], caps)
    except ValueError as e:
        raise PlanError(str(e)) from None

    def step(batch: Sequence[float]) -> float:
        return max(per_sample[r] * b for r, b in zip(ranks, batch, strict=True)) + collective_s

    members: dict[str, list[int]] = {}
    for r in ranks:
        members.setdefault(islands[r], []).append(r)
    alone: list[dict[str, Any]] = []
    for name, rs in members.items():
        vendor = [window.ranks[r].vendor_ns for r in rs]
        if len(rs) == 1:
            inside = 0.0
        elif all(v is not None for v in vendor):
            inside = min(v for v in vendor if v is not None) / n / 1e9
        else:
            inside = collective_s
        seconds = max(per_sample[r] for r in rs) * even + inside
        mixed = [window.ranks[r] for r in rs]
        alone.append({"island": name, "ranks": rs, "step_s": seconds, "samples_per_s": len(rs) * even / seconds,
                      # how the island spends a step in the mixed job now (means over its ranks)
                      "compute_s_per_step": sum(t.compute_ns for t in mixed) / len(rs) / n / 1e9,
                      "wait_s_per_step": sum(t.wait_ns for t in mixed) / len(rs) / n / 1e9,
                      "busy_share": round(sum(t.busy_share for t in mixed) / len(rs), 4)})
    bound = sum(a["samples_per_s"] for a in alone)
    even_step, planned_step = step([even] * len(ranks)), step(planned)
    measured_step = max((window.ranks[r].compute_ns + window.ranks[r].inside_ns) / n / 1e9 for r in ranks)
    return {
        "global_batch": global_batch,
        "plan": [{"rank": r, "island": islands[r], "batch": b, "current_batch": current[r],
                  "seconds_per_sample": per_sample[r], "busy_share": round(window.ranks[r].busy_share, 4)}
                 for r, b in zip(ranks, planned, strict=True)],
        "eta_mix_even": global_batch / even_step / bound,
        "eta_mix_planned": global_batch / planned_step / bound,
        "eta_mix_measured": sum(current[r] for r in ranks) / measured_step / bound,
        "step_s_even": even_step,
        "step_s_planned": planned_step,
        "step_s_measured": measured_step,
        "collective_s": collective_s,
        "islands": alone,
        "window": {"first_seq": window.first_seq, "last_seq": window.last_seq, "intervals": n},
        "ranks": [window.ranks[r].to_dict() for r in ranks],
    }
