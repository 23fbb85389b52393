"""The codes and names records and stats segments carry, and the busbw factor, from `_core`.

Never retyped: each tuple is the native core's own (a name's position is its code; codes
are append-only, csrc/include/hetobs/record/op_record.h and common/wire.h), so the Python
side cannot drift from the C++ one. `busbw_factor` is the recorder's rule itself.
"""

from __future__ import annotations

import functools

from . import _core

__all__ = [
    "STATS_LAYOUT_VERSION", "LATENCY_BUCKETS", "BANDWIDTH_BUCKETS", "LAG_BUCKETS", "OP_KINDS", "OP_CODES", "DTYPES",
    "DTYPE_CODES", "DTYPE_SIZES", "REDUCTIONS", "REDUCTION_CODES", "OP_STATES", "ALGORITHMS", "BACKENDS",
    "BACKEND_CODES", "DEVICE_TYPES", "DEVICE_CODES", "busbw_factor",
]

STATS_LAYOUT_VERSION: int = _core.STATS_LAYOUT_VERSION
LATENCY_BUCKETS: int = _core.LATENCY_BUCKETS  # bucket b: duration < 2**b microseconds (the last: the rest)
BANDWIDTH_BUCKETS: int = _core.BANDWIDTH_BUCKETS  # bucket b: busbw < 2**b MB/s (the last: the rest)
LAG_BUCKETS: int = _core.LAG_BUCKETS  # arrival lag: bucket b < 2**b microseconds (the last: the rest)

OP_KINDS: tuple[str, ...] = tuple(_core.OP_KINDS)
DTYPES: tuple[str, ...] = tuple(_core.DTYPES)
DTYPE_SIZES: tuple[int, ...] = tuple(_core.DTYPE_SIZES)
REDUCTIONS: tuple[str, ...] = tuple(_core.REDUCTIONS)  # the last, "other": a vendor reduction hetobs cannot name
OP_STATES: tuple[str, ...] = tuple(_core.OP_STATES)
ALGORITHMS: tuple[str, ...] = tuple(_core.ALGORITHMS)
BACKENDS: tuple[str, ...] = tuple(_core.BACKENDS)
DEVICE_TYPES: tuple[str, ...] = tuple(_core.DEVICE_TYPES)  # "other": the record's device field names it

OP_CODES: dict[str, int] = {name: code for code, name in enumerate(OP_KINDS)}
DTYPE_CODES: dict[str, int] = {name: code for code, name in enumerate(DTYPES)}
REDUCTION_CODES: dict[str, int] = {name: code for code, name in enumerate(REDUCTIONS)}
BACKEND_CODES: dict[str, int] = {name: code for code, name in enumerate(BACKENDS)}
DEVICE_CODES: dict[str, int] = {name: code for code, name in enumerate(DEVICE_TYPES)}


@functools.lru_cache(maxsize=4096)
def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of `op` over `n` ranks (busbw = algbw x it), as the
    native recorder applies it: 2(n-1)/n for all_reduce; (n-1)/n for all_gather, reduce_scatter,
    all_to_all, gather, scatter (0 at one rank: nothing crosses a bus); 1 for the rest.
    ValueError for a name that is no op kind."""
    return float(_core.busbw_factor(op, n))
