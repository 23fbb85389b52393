"""Rank program for tests/test_shm_single_copy.py: the four bandwidth collectives over shared
memory at sizes on both sides of HETOBS_SHM_SINGLE_COPY_BYTES, each checked against numpy, then
every link's single_copy_bytes (bytes this rank read straight out of the peer's buffer).

args: sizes (element counts), refuse (before init: make this process non-dumpable and drop
CAP_SYS_PTRACE, as a hardened container does, so the kernel refuses process_vm_readv between
the ranks), hang_at (with culprit: that rank stops before the op at that index of an endless
all_reduce loop, the others hang inside it).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from rank_programs import (Checker, Ctx, preparing_next_batch_until_killed, run_all_gather, run_all_reduce,
                           run_broadcast, run_reduce_scatter, tag_of)

_PR_SET_DUMPABLE = 4
_CAP_SYS_PTRACE = 19
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def refuse_cross_memory_attach() -> None:
    """The kernel lets a process read another's memory (ptrace_may_access) when it may ptrace it:
    same uid and a dumpable target, or CAP_SYS_PTRACE. Take both away from this process."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    bit = ~(1 << _CAP_SYS_PTRACE) & 0xFFFFFFFF
    data[0].effective &= bit
    data[0].permitted &= bit
    data[0].inheritable &= bit
    if libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def run(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    if args.get("refuse"):
        refuse_cross_memory_attach()
    comm = ctx.init()
    if "hang_at" in args:
        return _hang(ctx, comm, int(args["culprit"]), int(args["hang_at"]), int(args["hang_count"]))
    ck = Checker(ctx, 4321)
    world = list(range(comm.size))

    def ops() -> None:
        for n in args["sizes"]:
            for dt, op in (("float32", "sum"), ("int64", "max"), ("bfloat16", "avg")):
                run_all_reduce(ck, comm, world, tag_of("sc-ar", dt, n, op), n, dt, op)
                run_reduce_scatter(ck, comm, world, tag_of("sc-rs", dt, n, op), n, dt, op)
            run_all_gather(ck, comm, world, tag_of("sc-ag", n), n, "float64")
            run_broadcast(ck, comm, world, tag_of("sc-bc", n), n, "uint8", n % comm.size)

    ck.run("ops", ops)
    out: dict[str, Any] = {"rank": comm.rank, "pid": os.getpid(), **ck.result()}
    out["links"] = [{"peer": l["peer"], "transport": l["transport"], "single_copy_bytes": l["single_copy_bytes"],
                     "bytes_recv": l["bytes_recv"]} for l in comm.links()]
    comm.close()
    return out


def _hang(ctx: Ctx, comm: Any, culprit: int, at: int, count: int) -> dict[str, Any]:
    x = np.ones(count, np.float32)
    for i in range(at + 1):
        if i == at and comm.rank == culprit:
            preparing_next_batch_until_killed(ctx)
        if i == at:
            ctx.event("entering", seq=i)
        comm.all_reduce(x)
    return {"rank": comm.rank, "unexpected": "the op at the culprit's stop completed"}
