#!/usr/bin/env python3
"""all_reduce busbw over shared memory on torch CPU tensors against numpy arrays, cma against the
ring (HETOBS_SMALL_BYTES=0), one job per algorithm.

Why both buffer kinds: cma's copies are the kernel's (process_vm_readv/writev), which go about
twice as fast over transparent huge pages; numpy asks for them on large arrays (madvise), torch's
CPU allocator does not. docs/PERF.md "Toward the limit" has the table.

    python bench/cma_buffers.py --ranks 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

SIZES = (1 << 20, 16 << 20, 64 << 20)


def rank_main() -> None:
    import numpy as np
    import torch

    import hetobs

    comm = hetobs.init()
    out: dict[str, float] = {}
    for kind in ("torch", "numpy"):
        for nbytes in SIZES:
            x = torch.ones(nbytes // 4) if kind == "torch" else np.ones(nbytes // 4, np.float32)
            iters = max(10, (256 << 20) // nbytes)
            for _ in range(2):
                comm.all_reduce(x)
            best = float("inf")
            for _ in range(5):
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    comm.all_reduce(x)
                best = min(best, (time.perf_counter() - t0) / iters)
            out[f"{kind} {nbytes >> 20} MiB"] = round(nbytes * 2 * (comm.size - 1) / comm.size / best / 1e9, 2)
    algos = sorted({r["algorithm"] for r in comm.records() if r.get("op") == "all_reduce"})
    print(json.dumps({"rank": comm.rank, "busbw": out, "algorithms": algos}), flush=True)
    comm.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    from hetobs.bench.units import load_average
    from hetobs.launch_local import LocalJob

    print(f"`python bench/cma_buffers.py --ranks {args.ranks}`; load average {load_average()} at start; "
          "busbw GB/s (rank 0)\n")
    print("| algorithm | " + " | ".join(f"{k} {s >> 20} MiB" for k in ("torch", "numpy") for s in SIZES) + " |")
    print("|---|" + "---|" * (2 * len(SIZES)))
    for name, env in (("cma", {}), ("ring", {"HETOBS_SMALL_BYTES": "0"})):
        with tempfile.TemporaryDirectory() as d, LocalJob(
                [sys.executable, __file__, "--rank-main"], args.ranks, log_dir=d, hetobs_dir=d,
                env={"HETOBS_TRANSPORT": "shm", "HETOBS_DEBUG": "ERROR", **env}, stdout="log") as job:
            job.start()
            if not job.wait(600) or any(e.failed for e in job.exits()):
                print(f"{name}: the job failed:\n" + "\n".join(e.stderr_tail for e in job.exits()), file=sys.stderr)
                return 1
            res = json.loads(job.tail(0, "out", lines=1))
        if res["algorithms"] != [name]:
            print(f"{name}: ran {res['algorithms']}", file=sys.stderr)
            return 1
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in res["busbw"].values()) + " |")
    print(f"\nload average {load_average()} at the end")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--rank-main"]:
        rank_main()
    else:
        sys.exit(main())
