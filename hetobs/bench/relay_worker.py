"""One rank of the relay benchmark: `python -m hetobs.bench.relay_worker CONFIG_JSON RESULT_PATH`.

Started by hetobs.bench.relay with RANK, WORLD_SIZE (2), MASTER_ADDR, MASTER_PORT and
HETOBS_TRANSPORT set. Both ranks walk the same schedule (repetition -> size -> variant,
the variant order rotating per repetition), so every variant sees the machine's drift
alike. Per (rep, size, variant): a barrier, `warmup` untimed ops, then `iters` ops timed
as one batch on this rank. Writes {"rank", "samples": {variant: {size: [seconds per op,
one per rep]}}, "cpu": the same shape, CPU seconds per op of all this rank's threads} to
RESULT_PATH. Variants (2 ranks, each sends `size` bytes to the other and receives `size`
bytes from it):

* pipelined:   relay of staged buffers, pipeline=True
* unpipelined: the same, pipeline=False (copy all, send all, copy all)
* wire:        relay(stage="none") of host buffers (the wire stage alone: same bytes, same chunks)
Host staging (no device): stage "host" buffers, and
* copy:        chunk-sized memcpy on one copy thread into the staging slots
               (hetobs._core.relay_copy_bench), both ranks at once as in the pipeline
On a device (config "device", e.g. the stand-in accelerator "standin" with engines paced at
"copy_gbps"): stage "device" tensors, and
* d2h, h2d:    the device's copy lane alone, device -> staging slots, or back (relay_copy_bench
               with the device lane), both ranks at once
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any, Callable

import numpy as np


def _host_variants(comm: Any, cfg: dict[str, Any], peer: int, biggest: int) -> tuple[Callable, Callable]:
    from hetobs import _core

    chunk, slots = int(cfg["chunk_bytes"]), int(cfg["slots"])
    src_all = np.random.default_rng(comm.rank).integers(0, 256, biggest, dtype=np.uint8)
    dst_all = np.zeros(biggest, np.uint8)

    def one(variant: str, size: int) -> None:
        src, dst = src_all[:size], dst_all[:size]
        if variant == "copy":
            _core.relay_copy_bench(_core.buffer_address(src), size, chunk, slots)
            return
        stage = "none" if variant == "wire" else "host"
        comm.relay([(peer, src)], [(peer, dst)], stage=stage, pipeline=variant != "unpipelined",
                   chunk_bytes=chunk, slots=slots)

    def received() -> np.ndarray:
        return dst_all
    return one, received


def _device_variants(comm: Any, cfg: dict[str, Any], peer: int, biggest: int) -> tuple[Callable, Callable]:
    import torch

    import hetobs_standin
    from hetobs import _core
    from hetobs._relay_targets import device_lanes_available

    if not device_lanes_available():
        raise SystemExit("the device relay needs hetobs._torch_ext, which does not load here")
    hetobs_standin.set_copy_bandwidth(float(cfg["copy_gbps"]))
    dev = torch.device(cfg["device"], 0)
    chunk, slots = int(cfg["chunk_bytes"]), int(cfg["slots"])
    host_src = np.random.default_rng(comm.rank).integers(0, 256, biggest, dtype=np.uint8)
    src_all = torch.from_numpy(host_src).to(dev)
    dst_all = torch.zeros(biggest, dtype=torch.uint8, device=dev)
    wire_dst = np.zeros(biggest, np.uint8)
    code = int(torch.accelerator.current_stream(dev).device_type)

    def one(variant: str, size: int) -> None:
        if variant in ("d2h", "h2d"):
            t = src_all if variant == "d2h" else dst_all
            _core.relay_copy_bench(int(t.data_ptr()), size, chunk, slots, device_type=code, device_index=0,
                                   to_device=variant == "h2d")
            return
        if variant == "wire":
            comm.relay([(peer, host_src[:size])], [(peer, wire_dst[:size])], stage="none", chunk_bytes=chunk,
                       slots=slots)
            return
        comm.relay([(peer, src_all[:size])], [(peer, dst_all[:size])], stage="device",
                   pipeline=variant != "unpipelined", chunk_bytes=chunk, slots=slots)

    def received() -> np.ndarray:
        return dst_all.cpu().numpy()
    return one, received


def main() -> int:
    cfg = json.loads(sys.argv[1])
    out_path = sys.argv[2]
    import hetobs

    comm = hetobs.init()
    peer = 1 - comm.rank
    variants = list(cfg["variants"])
    samples: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    cpu: dict[str, dict[str, list[float]]] = {v: {} for v in variants}  # CPU seconds per op, all threads
    biggest = max(cfg["sizes"])
    one, received = (_device_variants if cfg.get("device") else _host_variants)(comm, cfg, peer, biggest)

    # Check each relay variant once, bit for bit (the peer's source is known from its seed).
    want = np.random.default_rng(peer).integers(0, 256, biggest, dtype=np.uint8)
    for v in ("pipelined", "unpipelined"):
        one(v, biggest)
        if not np.array_equal(received(), want):
            raise SystemExit(f"relay variant {v}: received bytes differ from the peer's")

    for rep in range(int(cfg["reps"])):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for size in cfg["sizes"]:
            warmup, iters = cfg["plan"][str(size)]
            for v in order:
                comm.barrier()
                for _ in range(warmup):
                    one(v, size)
                u0 = resource.getrusage(resource.RUSAGE_SELF)
                t0 = time.perf_counter()
                for _ in range(iters):
                    one(v, size)
                t1 = time.perf_counter()
                u1 = resource.getrusage(resource.RUSAGE_SELF)
                samples[v].setdefault(str(size), []).append((t1 - t0) / iters)
                used = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
                cpu[v].setdefault(str(size), []).append(used / iters)
    comm.barrier()
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"rank": comm.rank, "samples": samples, "cpu": cpu}, f)
    os.replace(tmp, out_path)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
