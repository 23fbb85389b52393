"""Real-GPU check of the torch wrapper over NCCL ("hetobs_nccl", hetobs._torch_ext), for a
machine with a CUDA build of torch and one GPU. Not collected by pytest (no GPU in CI).

    python3 tests/nccl/torch_gpu_check.py        # hetobs importable (built against that torch)

One rank, world size 1 (NCCL runs a real kernel even then): blocking and async all_reduce,
all_gather_into_tensor and broadcast on CUDA tensors, then checks that every op was
recorded with backend "nccl" and device "cuda", and that each record ends (through the
completion poller, which asks the op's CUDA event) without the script synchronizing on
it. Prints one JSON line; exit 0 when every check passed, 1 otherwise, 2 when no GPU.
"""

from __future__ import annotations

import json
import os
import sys
import time

from hetobs.ports import free_port


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "why": "no CUDA device"}))
        return 2
    import torch.distributed as dist

    import hetobs
    from hetobs.torch import native_wrapper

    port = free_port()
    os.environ.setdefault("HETOBS_JOB_ID", f"gpucheck{os.getpid()}")
    dist.init_process_group("hetobs_nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    work = dist.all_reduce(x, async_op=True)
    out = torch.empty(1 << 20, device="cuda")
    dist.all_gather_into_tensor(out, x)
    dist.broadcast(x, src=0)
    work.wait()
    checks: dict[str, bool] = {"native_wrapper": native_wrapper() is not None}
    deadline = time.monotonic() + 10
    while True:  # the poller ends records within ~200 us of the GPU finishing
        recs = [r for r in hetobs.records() if r["backend"] == "nccl"]
        if (recs and all(r["state"] != "started" for r in recs)) or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    checks["ops"] = [r["op"] for r in recs] == ["all_reduce", "all_reduce", "all_gather", "broadcast"]
    checks["completed"] = all(r["state"] == "completed" for r in recs)
    checks["device_cuda"] = bool(recs) and all(r["device_type"] == "cuda" for r in recs)
    checks["bytes"] = bool(recs) and recs[0]["bytes"] == 4 << 20
    checks["result"] = float(x[0]) == 1.0
    dist.destroy_process_group()
    print(json.dumps({"ok": all(checks.values()), "checks": checks, "torch": torch.__version__,
                      "records": [{k: r.get(k) for k in ("op", "state", "bytes", "device_type", "duration_ms")}
                                  for r in recs]}))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
