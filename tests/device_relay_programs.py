"""Rank-side programs of tests/test_device_relay.py: the relay's stage "device" on the stand-in
accelerator (hetobs_standin, torch device "standin"), through torch's device-generic API.

The stand-in is not a real device: its memory is host memory at addresses host code cannot
read, its host<->device copies run on paced copy-engine threads ordered by streams and
events. That is what these programs lean on: a relay that read device memory as host memory
would fault, one that did not order its copies after the caller's stream would send stale
bytes, one that synchronised the caller's stream on the host would show in host_waits.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

import hetobs_standin

from relay_programs import payload, sizes_for

DEV = torch.device("standin", 1)  # not the current device (0): the relay must not switch the caller's


def _matrix(comm: Any, pipeline: bool, async_op: bool, chunk: int, slots: int) -> list[str]:
    me, n = comm.rank, comm.size
    sends, recvs, expect = [], [], []
    for p in range(n):
        if p == me:
            continue
        for k, size in enumerate(sizes_for(me, p)):
            sends.append((p, torch.from_numpy(payload(me, p, k, size)).to(DEV)))
        for k, size in enumerate(sizes_for(p, me)):
            recvs.append((p, torch.full((size,), 0xA5, dtype=torch.uint8, device=DEV)))
            expect.append((p, k, payload(p, me, k, size)))
    stream_before = torch.accelerator.current_stream(DEV)
    res = comm.relay(sends, recvs, stage="device", pipeline=pipeline, chunk_bytes=chunk, slots=slots,
                     async_op=async_op)
    phases = res.result() if async_op else res
    label = f"pipeline={pipeline} async={async_op}"
    bad = []
    if torch.accelerator.current_device_index() != 0:
        bad.append(f"{label}: the caller's current device is now {torch.accelerator.current_device_index()}")
    if torch.accelerator.current_stream(DEV) != stream_before:
        bad.append(f"{label}: the caller's current stream changed")
    for (p, out), (_, k, want) in zip(recvs, expect):
        if not np.array_equal(out.cpu().numpy(), want):
            bad.append(f"{label}: message {k} from rank {p} ({want.size} bytes) differs")
    chunks = sum(max(1, -(-s // chunk)) for p in range(n) if p != me for s in sizes_for(me, p) + sizes_for(p, me))
    if phases["chunks"] != chunks or phases["d2h_ns"] <= 0 or phases["h2d_ns"] <= 0:
        bad.append(f"{label}: phases {phases}, expected {chunks} chunks and copy time both ways")
    return bad


def prog_matrix(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    comm = ctx.init()
    problems: list[str] = []
    for pipeline in (True, False):
        for async_op in (False, True):
            problems += _matrix(comm, pipeline, async_op, int(args["chunk"]), int(args["slots"]))
    recs = [r for r in comm.records() if r["op"] == "relay"]
    res = {"rank": comm.rank, "problems": problems, "devices": sorted({r["device_type"] for r in recs}),
           "records": len(recs), "engines": hetobs_standin.engine_stats(1)}
    comm.close()
    return res


def prog_order(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 writes its send buffer with an asynchronous copy on its current stream (a slow,
    paced engine: the copy takes tens of ms) and relays it at once: rank 1 must receive the new
    bytes, and rank 0's host must not have waited on its stream to get them there."""
    comm = ctx.init()
    n = 4 << 20
    hetobs_standin.set_copy_bandwidth(float(args["gbps"]))
    res: dict[str, Any] = {"rank": comm.rank}
    if comm.rank == 0:
        src = torch.zeros(n, dtype=torch.uint8, device=DEV)
        fresh = torch.from_numpy(payload(0, 1, 9, n)).pin_memory()
        torch.accelerator.synchronize(DEV)
        stream = torch.accelerator.current_stream(DEV)
        waits = hetobs_standin.host_waits(stream)
        t0 = time.monotonic()
        src.copy_(fresh, non_blocking=True)  # queued on the current stream; the engine needs ~n/gbps
        res["queued_s"] = time.monotonic() - t0
        res["phases"] = comm.relay([(1, src)], [], stage="device", chunk_bytes=1 << 20)
        res["host_waits_on_caller_stream"] = hetobs_standin.host_waits(stream) - waits
        res["copy_s"] = n / (float(args["gbps"]) * 1e9)
    else:
        dst = torch.empty(n, dtype=torch.uint8, device=DEV)
        comm.relay([], [(0, dst)], stage="device", chunk_bytes=1 << 20)
        res["exact"] = bool(np.array_equal(dst.cpu().numpy(), payload(0, 1, 9, n)))
    comm.close()
    return res


def prog_bad_input(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    comm = ctx.init()
    peer = 1 - comm.rank
    errors = []
    cases = [
        ("device", [(peer, torch.zeros(4))]),                                   # a CPU tensor
        ("device", [(peer, torch.zeros(4, device="standin:0")), (peer, torch.zeros(4, device="standin:1"))]),
        ("device", [(peer, torch.zeros(8, device="standin")[::2])]),            # not contiguous
        ("device", [(peer, np.zeros(4, np.uint8))]),                            # not a tensor
        ("none", [(peer, torch.zeros(4, device="standin"))]),                   # device memory is not host memory
    ]
    for stage, sends in cases:
        try:
            comm.relay(sends, [], stage=stage)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    comm.close()
    return {"rank": comm.rank, "errors": errors}


PROGRAMS = {"matrix": prog_matrix, "order": prog_order, "bad_input": prog_bad_input}


def run(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return PROGRAMS[args["case"]](ctx, args)
