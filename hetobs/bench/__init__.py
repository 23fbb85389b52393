"""Collective benchmarks: the hetobs native transport and torch's Gloo, side by side.

`run_bench(BenchConfig(...))` launches one long-lived job (a process per rank) per
backend and drives them size by size, interleaving backends within every
repetition so machine drift affects all of them alike. Bandwidth follows
nccl-tests: algbw = bytes / time, busbw = algbw x `bus_factor(op, n)`.

Modules, one concept each: units (sizes, dtypes, busbw factors), config (BenchConfig),
backends (what each backend is and the job that runs it), workers (the JSON-line protocol
of a running job; its ranks on hetobs.launch_local), mpi_job (Open MPI's ranks under
mpirun), runner (run_bench: the interleaved measurement loop), rows (timings to
nccl-tests rows). relay, overhead and local_job are the relay benchmark, the cost of
watching a DDP step, and short local jobs run to completion.

This package never prints or exits; `hetobs bench` (cli/bench.py) renders it.
"""

from __future__ import annotations

from .backends import BACKENDS, backend_unavailable
from .config import BINDINGS, BenchConfig, Progress
from .rows import BenchResult, Row
from .runner import measure_memcpy, run_bench
from .units import (
    DEFAULT_SIZES,
    DTYPES,
    OPS,
    QUICK_SIZES,
    bus_factor,
    element_count,
    format_size,
    parse_size,
    parse_sizes,
    plan_iters,
)
from .workers import BenchError

__all__ = [
    "BACKENDS", "BINDINGS", "DEFAULT_SIZES", "DTYPES", "OPS", "QUICK_SIZES", "BenchConfig", "BenchError", "BenchResult",
    "Progress", "Row", "backend_unavailable", "bus_factor", "element_count", "format_size", "measure_memcpy",
    "parse_size", "parse_sizes", "plan_iters", "run_bench",
]
