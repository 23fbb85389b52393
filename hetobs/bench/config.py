"""What `hetobs bench` is asked to run (BenchConfig) and how far it got (Progress)."""

from __future__ import annotations

from dataclasses import dataclass

from .backends import BACKENDS
from .units import DEFAULT_SIZES, DTYPES, OPS, QUICK_SIZES, MiB

__all__ = ["BINDINGS", "BenchConfig", "Progress"]

#: How ranks are placed on CPUs. none: where the scheduler puts them (Open MPI: its default
#: binding); core: rank r on the r-th CPU this process may use, modulo their number, for every
#: backend alike (Open MPI's own binding turned off), so backends and algorithms are compared
#: with the same placement.
BINDINGS = ("none", "core")


@dataclass
class BenchConfig:
    ranks: int = 2
    op: str = "all_reduce"
    backends: tuple[str, ...] = ("hetobs-shm", "hetobs-tcp", "gloo", "ompi")
    sizes: tuple[int, ...] | None = None  # None: DEFAULT_SIZES (QUICK_SIZES with quick)
    reps: int | None = None  # None: 5 (3 with quick)
    dtype: str = "float32"
    quick: bool = False
    timeout_s: float = 120.0  # per batch (the job is stopped and the backend marked failed after it)
    start_timeout_s: float = 180.0  # job start-up (imports + rendezvous)
    memcpy_bytes: int | None = None  # None: 256 MiB (64 MiB with quick); 0 skips the measurement
    check: bool = True  # verify each op's result once per size (untimed)
    bind: str = "none"  # one of BINDINGS

    def resolved(self) -> "BenchConfig":
        """A copy with defaults filled in and every field validated (ValueError names the field)."""
        if self.op not in OPS:
            raise ValueError(f"op={self.op!r}: expected one of {', '.join(OPS)}")
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise ValueError(f"ranks={self.ranks!r}: expected at least 1")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: expected one of {', '.join(DTYPES)}")
        backends = tuple(dict.fromkeys(self.backends))
        if not backends:
            raise ValueError("backends: expected at least one")
        for b in backends:
            if b not in BACKENDS:
                raise ValueError(f"backend {b!r}: expected one of {', '.join(BACKENDS)}")
        sizes = tuple(self.sizes) if self.sizes is not None else (QUICK_SIZES if self.quick else DEFAULT_SIZES)
        if not sizes or any(int(s) < 1 for s in sizes):
            raise ValueError(f"sizes={sizes!r}: expected positive byte counts")
        reps = self.reps if self.reps is not None else (3 if self.quick else 5)
        if reps < 1:
            raise ValueError(f"reps={reps}: expected at least 1")
        memcpy = self.memcpy_bytes if self.memcpy_bytes is not None else (64 * MiB if self.quick else 256 * MiB)
        if self.bind not in BINDINGS:
            raise ValueError(f"bind={self.bind!r}: expected one of {', '.join(BINDINGS)}")
        if self.timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        return BenchConfig(ranks=self.ranks, op=self.op, backends=backends, sizes=tuple(int(s) for s in sizes),
                           reps=int(reps), dtype=self.dtype, quick=self.quick, timeout_s=float(self.timeout_s),
                           start_timeout_s=float(self.start_timeout_s), memcpy_bytes=int(memcpy), check=self.check,
                           bind=self.bind)


@dataclass
class Progress:
    done: int
    total: int
    message: str

