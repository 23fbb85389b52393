"""The benchmark's table: one nccl-tests row per (backend, size), from the ranks' timings.

A (backend, size) time is the max over ranks of each rank's median over repetitions (each
sample a batch average, timed barrier-free as nccl-tests does); algbw = size / time, busbw =
algbw x bus_factor(op, n). Rows also carry the ratio to Gloo's and Open MPI's busbw at the
same size in the same run, and to memcpy bandwidth for sizes of 16 MiB and more, and the CPU
time per op: where ranks share cores and sleep while they wait (loopback TCP), a backend that
needs less wall time but as much CPU won by scheduling, not by doing less work (ranks that spin
or yield while waiting spend CPU in proportion to wall time, and there it adds nothing).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from .config import BenchConfig
from .copy_probe import CopyRates
from .units import REDUCING_OPS, ROOTED_OPS, MiB, bus_factor, cpu_model

__all__ = ["BenchResult", "Plan", "Row", "Samples", "table_rows"]

#: One size as it really runs: (bytes, count, warmup, timed iterations).
Plan = list[tuple[int, int, int, int]]
#: samples[backend][size index][rank] -> batch-average seconds, one per repetition.
Samples = dict[str, list[list[list[float]]]]


@dataclass
class Row:
    """One (backend, size) line, in nccl-tests terms. Times in microseconds, bandwidths in GB/s (1e9)."""

    backend: str
    op: str
    ranks: int
    size: int  # bytes
    count: int  # elements
    type: str  # nccl-tests type name ("float")
    redop: str  # "sum", or "none" for ops that do not reduce
    root: int  # -1 for ops without a root
    time_us: float
    algbw: float
    busbw: float
    busbw_vs_gloo: float | None = None  # busbw / Gloo's busbw at this size, same run
    busbw_vs_ompi: float | None = None  # busbw / Open MPI's busbw at this size, same run
    busbw_of_memcpy: float | None = None  # busbw / memcpy GB/s, for sizes >= 16 MiB
    memcpy_gbs: float | None = None
    reps: int = 0  # repetitions measured
    warmup: int = 0
    iters: int = 0  # timed iterations per batch
    rank_time_us: list[float] = field(default_factory=list)  # each rank's median
    # CPU time (user + system, every thread of the rank's process) per op: the mean over ranks of
    # each rank's median; None where the ranks did not report it
    cpu_us: float | None = None
    bind: str = "none"  # how ranks were placed on CPUs (config.BINDINGS)
    cpu_model: str = ""  # the machine's CPU model (units.cpu_model)
    # the kernel's cross-process copy over memcpy, in cache (copy_probe.py): below ~0.5 two
    # memcpys through shared memory cost less than one kernel copy of a cache-resident message
    kernel_copy_of_memcpy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)



@dataclass
class BenchResult:
    config: BenchConfig
    rows: list[Row]
    memcpy_gbs: float | None
    copies: CopyRates | None = None  # memcpy and the kernel's copy in cache (None: not measured)
    failures: dict[str, str] = field(default_factory=dict)  # backend -> error (partial rows may remain)
    skipped: dict[str, str] = field(default_factory=dict)  # backend -> why it was not run
    info: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend -> what its ranks reported
    notes: list[str] = field(default_factory=list)  # things a reader of the numbers should know
    wall_s: float = 0.0

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.rows]



def table_rows(cfg: BenchConfig, plan: Plan, samples: Samples, memcpy_gbs: float | None, type_name: str,
               cpu: Samples | None = None, copies: CopyRates | None = None) -> list[Row]:
    """The rows of every (backend, size) that completed on every rank, in config order; `cpu`, the
    batches' CPU seconds per op in the shape of `samples`, gives cpu_us; `copies`, the machine's
    copy probe, kernel_copy_of_memcpy."""
    n = cfg.ranks
    factor = bus_factor(cfg.op, n)
    rows: list[Row] = []
    model = cpu_model()
    for b in cfg.backends:
        if b not in samples:
            continue
        for i, (nbytes, count, warmup, iters) in enumerate(plan):
            per_rank = samples[b][i]
            if not per_rank or any(not s for s in per_rank):
                continue  # this size never completed on every rank (backend failed first)
            medians = [statistics.median(s) for s in per_rank]
            t = max(medians)
            per_rank_cpu = cpu[b][i] if cpu and b in cpu else []
            cpu_us = (statistics.fmean(statistics.median(s) for s in per_rank_cpu) * 1e6
                      if per_rank_cpu and all(per_rank_cpu) else None)
            algbw = nbytes / t / 1e9 if t > 0 else 0.0
            rows.append(Row(
                backend=b, op=cfg.op, ranks=n, size=nbytes, count=count, type=type_name,
                redop="sum" if cfg.op in REDUCING_OPS else "none", root=0 if cfg.op in ROOTED_OPS else -1,
                time_us=t * 1e6, algbw=algbw, busbw=algbw * factor, memcpy_gbs=memcpy_gbs,
                reps=min(len(s) for s in per_rank), warmup=warmup, iters=iters,
                rank_time_us=[m * 1e6 for m in medians], cpu_us=cpu_us, bind=cfg.bind,
                cpu_model=model, kernel_copy_of_memcpy=copies.kernel_of_memcpy if copies else None,
            ))
    gloo = {r.size: r for r in rows if r.backend == "gloo"}
    ompi = {r.size: r for r in rows if r.backend == "ompi"}
    for r in rows:
        g = gloo.get(r.size)
        if r.backend != "gloo" and g is not None and g.busbw > 0:
            r.busbw_vs_gloo = r.busbw / g.busbw
        m = ompi.get(r.size)
        if r.backend != "ompi" and m is not None and m.busbw > 0:
            r.busbw_vs_ompi = r.busbw / m.busbw
        if memcpy_gbs and r.size >= 16 * MiB:
            r.busbw_of_memcpy = r.busbw / memcpy_gbs
    return rows
