"""Rank programs of the wire-hardening tests (tests/test_strangers.py, tests/test_wire_fuzz.py),
run through tests/rank_programs.py (PROGRAMS "strangers", "fuzz_target")."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np


def _exc(e: BaseException) -> dict[str, Any]:
    return {"type": type(e).__name__, "message": str(e)}


def strangers(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Join while strangers sit on the rendezvous port; then, at gate 'strangers-<rank>' (the
    test has strangers on every listener by then), make a new communicator (fresh connections
    through the listeners) and run collectives; wait at gate 'dumped-<rank>' while the test
    dumps the job; run one more op and close."""
    if ctx.rank != 0:
        ctx.gate_wait(f"join-{ctx.rank}")  # the test queues strangers on rank 0's port first
    t0 = time.monotonic()
    comm = ctx.init()
    res: dict[str, Any] = {"rank": ctx.rank, "init_seconds": time.monotonic() - t0}
    ctx.event("joined")
    ctx.gate_wait(f"strangers-{ctx.rank}")
    t1 = time.monotonic()
    sub = comm.split(0, ctx.world - 1 - ctx.rank)  # another order: every pair connects anew
    x = np.full(1024, float(ctx.rank + 1), np.float32)
    sub.all_reduce(x)
    res["split_seconds"] = time.monotonic() - t1
    res["sum"] = float(x[0])
    ctx.event("connected")
    ctx.gate_wait(f"dumped-{ctx.rank}")
    y = np.ones(16, np.float32)
    comm.all_reduce(y)
    res["after"] = float(y[0])
    sub.close()
    comm.close()
    return res


def fuzz_target(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 of a 2-rank world whose rank 1 is the test itself (a Python client that speaks
    the handshake and then sends hostile frames): receive until the op fails, report the error.
    The launcher's rank 1 (HETOBS_TEST_FAKE_PEER) only stands in for it and returns at once."""
    if os.environ.get("HETOBS_TEST_FAKE_PEER"):
        return {"rank": ctx.rank, "fake": True}
    comm = ctx.init()
    res: dict[str, Any] = {"rank": ctx.rank, "errors": []}
    n = int(args.get("n", 4096))
    for _ in range(int(args.get("ops", 1))):
        x = np.ones(n, np.float32)
        try:
            comm.all_reduce(x)
            res["errors"].append(None)
        except Exception as e:
            res["errors"].append(_exc(e))
            break
    try:
        comm.close()
    except Exception as e:
        res["close"] = _exc(e)
    return res
