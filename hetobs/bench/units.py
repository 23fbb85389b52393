"""The benchmark's units and arithmetic: the ops and dtypes it drives, the sizes it runs,
how a requested size becomes an element count, and the nccl-tests busbw factor.

Bandwidth follows nccl-tests exactly: `size` is the larger of a rank's input and output
buffers (the whole gathered/scattered buffer for all_gather, reduce_scatter and
all_to_all), algbw = size / time, busbw = algbw x `bus_factor(op, n)`.
"""

from __future__ import annotations

import os
import platform
import re

from ..codes import busbw_factor

__all__ = [
    "DEFAULT_SIZES", "DTYPES", "OPS", "QUICK_SIZES", "bus_factor", "cpu_model", "element_count", "format_size",
    "load_average", "parse_size", "parse_sizes", "plan_iters",
]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: Collectives the benchmark drives (every one both hetobs and Gloo implement).
OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")

#: dtype name -> (item size in bytes, nccl-tests type name).
DTYPES: dict[str, tuple[int, str]] = {
    "float32": (4, "float"),
    "float64": (8, "double"),
    "float16": (2, "half"),
    "int32": (4, "int32"),
    "int64": (8, "int64"),
    "int8": (1, "int8"),
    "uint8": (1, "uint8"),
}

#: 8 B, then powers of 4 from 64 B to 64 MiB.
DEFAULT_SIZES: tuple[int, ...] = (8,) + tuple(4 ** k for k in range(3, 14))
#: A few sizes for a demo: latency, mid, and one >= 16 MiB so the memcpy fraction shows.
QUICK_SIZES: tuple[int, ...] = (8, 64 * KiB, 1 * MiB, 16 * MiB)

#: Ops that reduce (nccl-tests' redop column says "sum") and ops with a root (its root column says 0).
REDUCING_OPS = frozenset({"all_reduce", "reduce_scatter", "reduce"})
ROOTED_OPS = frozenset({"broadcast", "reduce", "gather", "scatter"})
_BLOCKED = {"all_gather", "reduce_scatter", "all_to_all"}  # total count must split evenly over ranks


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw factor: busbw = algbw x factor, for `n` ranks (the native recorder's
    rule, hetobs.codes.busbw_factor: 0 at one rank for all_gather as for all_reduce)."""
    if n < 1:
        raise ValueError(f"n={n}: need at least one rank")
    return busbw_factor(op, n)


def element_count(op: str, size: int, n: int, itemsize: int) -> int:
    """Total elements of the benchmarked buffer for a requested size in bytes.

    As nccl-tests: all_gather / reduce_scatter / all_to_all round down to a multiple
    of the rank count (at least one element per rank); others take size // itemsize,
    at least one.
    """
    count = max(1, size // itemsize)
    if op in _BLOCKED:
        count = max(1, count // n) * n
    return count


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'8' -> 8, '4K' -> 4096, '1M' / '1MiB' / '1MB' -> 1048576, '1G' -> 2**30 (binary, as nccl-tests)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"size {text!r}: expected bytes with an optional K, M or G suffix (e.g. 8, 4K, 64M)")
    value = float(m.group(1)) * {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1 << 40}[m.group(2).lower()]
    if value < 1 or value != int(value):
        raise ValueError(f"size {text!r}: must be a whole number of bytes, at least 1")
    return int(value)


def parse_sizes(text: str) -> tuple[int, ...]:
    """Comma-separated sizes ('8,1M,64M'); order kept, duplicates dropped."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ValueError(f"sizes {text!r}: expected a comma-separated list such as 8,1M,64M")
    return tuple(dict.fromkeys(parse_size(p) for p in parts))


def format_size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    if n >= MiB:
        return f"{n / MiB:.1f} MiB"
    if n >= KiB:
        return f"{n / KiB:.1f} KiB"
    return f"{n} B"


def cpu_model() -> str:
    """This machine's CPU model (/proc/cpuinfo's first "model name"): the same bench on another
    model moves the order of algorithms, not only the numbers, so every row names it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as a bench prints them beside its numbers."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def plan_iters(size: int, quick: bool = False) -> tuple[int, int]:
    """(warmup, timed iterations) for one batch: fewer iterations as sizes grow, so a batch
    moves about 256 MiB (32 MiB in quick mode) and the 64 MiB case stays short on 2 cores.
    Up to 2,000 ops per batch: a batch of 100 small ops lasted 0.2-0.5 ms, so one lost time
    slice (the runner, a timer) moved it by 20-50% (16 KiB ratios to Open MPI from 0.41 to
    1.28 between runs of the same build; alone, both sides varied under 5%). At least 10 (as
    nccl-tests' 20): the ranks start a batch when each gets the runner's word, not together,
    and with 4 ops of 64 MiB that skew was ~15% of the batch (2 ranks: 6.9 GB/s in the bench
    against 8.1 in a loop of the same op, bench/small_ops.py)."""
    budget, lo, hi = (32 * MiB, 2, 20) if quick else (256 * MiB, 10, 2000)
    iters = max(lo, min(hi, budget // max(1, size)))
    warmup = 1 if quick else max(1, min(10, iters // 5))
    return warmup, iters
