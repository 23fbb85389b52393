"""Real-GPU check of islands (hetobs_islands) and of the relay's device stages, for a machine
with a CUDA build of torch and one GPU. Not collected by pytest (no GPU in CI); run by
tests/nccl/gpu_all.sh. `--device standin` runs the same on the stand-in accelerator, which
is how this script itself is tested where there is no GPU.

    python3 tests/nccl/islands_gpu_check.py [--device cuda] [--mib 64] [--reps 5]

1. Islands: rank 0 is an island on the device with the device's own library inside (NCCL on
   cuda, sccl on the stand-in), rank 1 a cpu island with Gloo. tests/islands_program.py runs
   every collective, dtype and reduction across them, checked against numpy on each rank.
2. The relay between two ranks on the device: stage "cuda" (the core's native CUDA lane; cuda
   only) and stage "device" (torch's device-generic lane, hetobs._torch_ext), pipelined and
   not, bit-exact, with medians of the wall time per op and the phases.
Prints one JSON document; exit 0 when every check passed, 1 otherwise, 2 when no device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from hetobs.bench.local_job import result_of, run_local

HERE = Path(__file__).resolve().parent
ISLANDS_PROGRAM = HERE.parent / "islands_program.py"


def islands(device: str) -> dict:
    library = "nccl" if device == "cuda" else "sccl"
    ranks = [{"HETOBS_ISLAND": "g", "HETOBS_ISLAND_DEVICE": device, "HETOBS_ISLAND_BACKEND": library},
             {"HETOBS_ISLAND": "c", "HETOBS_ISLAND_DEVICE": "cpu", "HETOBS_ISLAND_BACKEND": "gloo"}]
    results = [result_of(p) for p in run_local([sys.executable, str(ISLANDS_PROGRAM)], ranks, 600,
                                               env={"HETOBS_RECORDS": "16384"})]
    ok = all(not r.get("error") and r.get("failures") == [] for r in results) and \
        len({r.get("digest") for r in results}) == 1
    return {"ok": ok, "ranks": [{k: r.get(k) for k in ("error", "failures", "devices", "libraries", "relay_devices",
                                                       "ops")} for r in results]}


def relay_rank(device: str, mib: int, reps: int) -> None:
    """One rank of the relay check (both ranks on the device)."""
    import numpy as np
    import torch

    import hetobs

    if device == "standin":
        import hetobs_standin  # noqa: F401
    comm = hetobs.init()
    peer = 1 - comm.rank
    n = mib << 20
    dev = torch.device(device, 0)
    src = torch.from_numpy(np.random.default_rng(comm.rank).integers(0, 256, n, dtype=np.uint8)).to(dev)
    dst = torch.zeros(n, dtype=torch.uint8, device=dev)
    want = np.random.default_rng(peer).integers(0, 256, n, dtype=np.uint8)
    stages = (["cuda"] if device == "cuda" else []) + ["device"]
    out: dict = {}
    for stage in stages:
        for pipeline in (True, False):
            key = f"{stage}/{'pipelined' if pipeline else 'unpipelined'}"
            try:
                dst.zero_()
                comm.relay([(peer, src)], [(peer, dst)], stage=stage, pipeline=pipeline)
                exact = bool(np.array_equal(dst.cpu().numpy(), want))
                times, phases = [], []
                for _ in range(reps):
                    comm.barrier()
                    t0 = time.perf_counter()
                    phases.append(comm.relay([(peer, src)], [(peer, dst)], stage=stage, pipeline=pipeline))
                    times.append(time.perf_counter() - t0)
                t = statistics.median(times)
                med = {k: statistics.median(p[k] for p in phases) for k in ("d2h_ns", "wire_ns", "h2d_ns")}
                out[key] = {"exact": exact, "seconds": t, "gbps": n / t / 1e9, "phases_ms": {
                    k: v / 1e6 for k, v in med.items()}}
            except Exception as e:  # a stage this machine cannot run is reported, not fatal
                out[key] = {"error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps(out), flush=True)
    comm.close()


def relay(device: str, mib: int, reps: int) -> dict:
    argv = [sys.executable, __file__, "--relay-rank", "--device", device, "--mib", str(mib), "--reps", str(reps)]
    results = [result_of(p) for p in run_local(argv, [{}, {}], 600)]
    ok = all(not r.get("error") for r in results) and all(
        v.get("exact") for r in results for v in r.values() if isinstance(v, dict) and "error" not in v)
    return {"ok": ok, "ranks": results}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--relay-rank", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.relay_rank:
        relay_rank(a.device, a.mib, a.reps)
        return 0
    import torch

    if a.device == "standin":
        import hetobs_standin  # noqa: F401
    elif not torch.cuda.is_available():
        print(json.dumps({"ok": False, "why": "no CUDA device"}))
        return 2
    doc = {"device": a.device, "torch": torch.__version__, "islands": islands(a.device),
           "relay": relay(a.device, a.mib, a.reps)}
    doc["ok"] = doc["islands"]["ok"] and doc["relay"]["ok"]
    print(json.dumps(doc, indent=1))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
