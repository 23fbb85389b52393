"""Collective benchmarks: the hetobs native transport and torch's Gloo, side by side.

`run_bench(BenchConfig(...))` launches one long-lived job (a process per rank) per
backend and drives them size by size, interleaving backends within every
repetition so machine drift affects all of them alike. Bandwidth follows
nccl-tests: algbw = bytes / time, busbw = algbw x `bus_factor(op, n)`.

This package never prints or exits; `hetobs bench` (cli/bench.py) renders it.
"""

from __future__ import annotations

from .runner import (
    BACKENDS,
    DEFAULT_SIZES,
    DTYPES,
    OPS,
    QUICK_SIZES,
    BenchConfig,
    BenchError,
    BenchResult,
    Progress,
    Row,
    backend_unavailable,
    bus_factor,
    element_count,
    format_size,
    measure_memcpy,
    parse_size,
    parse_sizes,
    plan_iters,
    run_bench,
)

__all__ = [
    "BACKENDS", "DEFAULT_SIZES", "DTYPES", "OPS", "QUICK_SIZES", "BenchConfig", "BenchError", "BenchResult",
    "Progress", "Row", "backend_unavailable", "bus_factor", "element_count", "format_size", "measure_memcpy",
    "parse_size", "parse_sizes", "plan_iters", "run_bench",
]
