"""What one copy costs on this machine, in cache: memcpy against the kernel's cross-process copy.

hetobs's shared-memory paths move a message with two memcpys through a shared segment, or with
one `process_vm_readv`/`writev` straight between the ranks' buffers (single copy, cma). Which is
cheaper depends on the machine: the kernel's copy ran at 0.57 of memcpy's speed in cache on the
machine the defaults were measured on, and at 0.23-0.27 on another, where two memcpys led one
kernel copy up to 32 MiB at 2 ranks (docs/PERF.md, "Item 1 on this machine"). The bench measures
both at one cache-resident size and reports them beside its tables, so every run says which kind
of machine it ran on. The kernel's copy is timed reading this process's own memory: the same
system call and page pinning a peer's read costs, without a second process.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from .units import KiB

__all__ = ["CopyRates", "measure_copies"]


@dataclass(frozen=True)
class CopyRates:
    nbytes: int  # bytes per copy (cache-resident)
    memcpy_gbs: float  # numpy copy, GB/s (1e9 bytes/s), best of the repeats
    kernel_gbs: float | None  # process_vm_readv of the same bytes; None where the kernel refuses it

    @property
    def kernel_of_memcpy(self) -> float | None:
        return self.kernel_gbs / self.memcpy_gbs if self.kernel_gbs and self.memcpy_gbs > 0 else None


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _process_vm_readv() -> Any:
    try:
        f = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_ssize_t
    f.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                  ctypes.c_ulong]
    return f


_CALLS = 8  # copies per timed sample: the Python call around each is ~1 us, a 256 KiB copy 5-20


def _sample(copy: Callable[[], bool]) -> float | None:
    """Seconds for `_CALLS` calls of `copy` (None when a call fails)."""
    t0 = time.perf_counter()
    for _ in range(_CALLS):
        if not copy():
            return None
    return time.perf_counter() - t0


def measure_copies(nbytes: int = 256 * KiB, repeats: int = 100) -> CopyRates:
    """memcpy and the kernel's cross-process copy of `nbytes` (both buffers in cache), each the best
    of `repeats` samples, the two interleaved so that a slow stretch of the machine (a neighbour, a
    timer) meets both alike."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)

    def memcpy() -> bool:
        np.copyto(dst, src)
        return True

    readv = _process_vm_readv()
    local, remote = _IoVec(dst.ctypes.data, nbytes), _IoVec(src.ctypes.data, nbytes)
    pid = os.getpid()

    def kernel() -> bool:
        return bool(readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == nbytes)

    memcpy()  # pages faulted, lines cached
    kernel_ok = readv is not None and kernel()
    best_memcpy = best_kernel = float("inf")
    for _ in range(max(1, repeats)):
        best_memcpy = min(best_memcpy, _sample(memcpy) or float("inf"))
        if kernel_ok:
            t = _sample(kernel)
            kernel_ok = t is not None
            best_kernel = min(best_kernel, t if t is not None else float("inf"))
    moved = nbytes * _CALLS / 1e9
    return CopyRates(nbytes=nbytes, memcpy_gbs=moved / best_memcpy,
                     kernel_gbs=moved / best_kernel if kernel_ok else None)
