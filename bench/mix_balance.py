"""Mixed efficiency of a two-island job, even split vs the split `hetobs plan` proposes.

    .venv/bin/python bench/mix_balance.py [--worlds 2,4] [--ratios 2,3] [--backend hetobs_islands]
        [--per-sample 0.004] [--batch 24] [--steps 20] [--grad 65536] [--reps 3]

Two islands of world/2 ranks each ("fast" and "slow"); rank speed r_i is sleep-made
compute: a rank of the slow island takes ratio x --per-sample seconds per sample. A step
is compute (batch x seconds per sample), then an all_reduce of a --grad float32 gradient.

For each (world, ratio):
1. the mixed job at the even split (--batch per rank), held at its end while
   `hetobs plan --job ID --global-batch B --json` reads it live;
2. the mixed job at the planned split;
3. each island alone, as its own job (its ranks, plain Gloo inside) at the even split's
   per-rank batch.
eta_mix = mixed throughput (samples/s over the timed steps) / sum of the islands' alone
throughputs. Each of the four jobs runs --reps times, in rotation (so load drifts hit
all alike), and its median throughput counts. Prints a markdown table (docs/PERF.md holds one). `--backend hetobs_gloo`
runs the mixed job over flat (instrumented) Gloo instead of the islands backend.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from hetobs.ports import free_port

WARMUP = 2


def _worker() -> None:
    import torch
    import torch.distributed as dist

    import hetobs  # noqa: F401 - registers the hetobs backends

    per_sample, batch = float(os.environ["BENCH_PER_SAMPLE"]), int(os.environ["BENCH_BATCH"])
    steps = int(os.environ["BENCH_STEPS"])
    dist.init_process_group(os.environ["BENCH_BACKEND"])
    grad = torch.ones(int(os.environ["BENCH_GRAD"]))
    for i in range(WARMUP + steps):
        if i == WARMUP:
            t0 = time.perf_counter()
        time.sleep(batch * per_sample)  # the rank's compute: its speed
        dist.all_reduce(grad)
    elapsed = time.perf_counter() - t0
    hold = os.environ.get("BENCH_HOLD")
    if hold:  # the driver plans from the live job, then writes a line here
        with open(f"{hold}/ready-{dist.get_rank()}", "w") as f:
            f.write("ready\n")
        with open(f"{hold}/go-{dist.get_rank()}") as f:
            f.read()
    print("RESULT " + json.dumps({"elapsed": elapsed, "batch": batch, "steps": steps}), flush=True)
    dist.destroy_process_group()


def _run(ranks: list[dict[str, str]], env: dict[str, str], plan_batch: int | None = None,
         tmp: str = "") -> tuple[float, dict | None]:
    """Start one job (rank i gets ranks[i]); returns (samples/s, hetobs plan JSON when plan_batch is given)."""
    job = f"mix{uuid.uuid4().hex[:8]}"
    port = str(free_port())
    hold = ""
    if plan_batch is not None:
        hold = tempfile.mkdtemp(dir=tmp)
        for r in range(len(ranks)):
            os.mkfifo(f"{hold}/ready-{r}")
            os.mkfifo(f"{hold}/go-{r}")
    procs = []
    for r, extra in enumerate(ranks):
        e = {**os.environ, **env, **extra, "RANK": str(r), "WORLD_SIZE": str(len(ranks)), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port, "HETOBS_JOB_ID": job, "HETOBS_DIR": tmp, "BENCH_HOLD": hold,
             "OMP_NUM_THREADS": "1", "HETOBS_TIMEOUT": "120"}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    doc = None
    try:
        if plan_batch is not None:
            for r in range(len(ranks)):
                with open(f"{hold}/ready-{r}") as f:
                    f.read()
            p = subprocess.run([sys.executable, "-m", "hetobs.cli", "plan", "--job", job, "--global-batch",
                                str(plan_batch), "--dir", tmp, "--json"], capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                raise SystemExit(f"hetobs plan failed: {p.stderr.strip()}")
            doc = json.loads(p.stdout)
            for r in range(len(ranks)):
                with open(f"{hold}/go-{r}", "w") as f:
                    f.write("go\n")
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    results = []
    for (out, err), p in zip(outs, procs):
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
        if p.returncode != 0 or line is None:
            raise SystemExit(f"a rank failed (exit {p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(line[7:]))
    elapsed = max(r["elapsed"] for r in results)
    return sum(r["batch"] * r["steps"] for r in results) / elapsed, doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--ratios", default="2,3")
    ap.add_argument("--backend", default="hetobs_islands", choices=("hetobs_islands", "hetobs_gloo"))
    ap.add_argument("--per-sample", type=float, default=0.004, help="seconds per sample on the fast island")
    ap.add_argument("--batch", type=int, default=24, help="per-rank batch of the even split")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--grad", type=int, default=65536, help="gradient elements (float32)")
    ap.add_argument("--reps", type=int, default=3, help="runs of each job (median)")
    a = ap.parse_args()
    if a.worker:
        _worker()
        return
    base = {"BENCH_STEPS": str(a.steps), "BENCH_GRAD": str(a.grad)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetobs-mix-") as tmp:
        for world in (int(w) for w in a.worlds.split(",")):
            for ratio in (float(x) for x in a.ratios.split(",")):
                half = world // 2
                # islands interleaved in rank order (0 slow, 1 fast, ...): they need not be contiguous
                speed = {r: a.per_sample * (ratio if r % 2 == 0 else 1.0) for r in range(world)}
                island = {r: "slow" if r % 2 == 0 else "fast" for r in range(world)}
                total = a.batch * world

                def ranks(batch: dict[int, int]) -> list[dict[str, str]]:
                    return [{"BENCH_PER_SAMPLE": str(speed[r]), "BENCH_BATCH": str(batch[r]),
                             "BENCH_BACKEND": a.backend, "HETOBS_ISLAND": island[r],
                             "HETOBS_ISLAND_BACKEND": "gloo"} for r in range(world)]

                _, plan = _run(ranks({r: a.batch for r in range(world)}), base, plan_batch=total, tmp=tmp)
                assert plan is not None
                planned = {e["rank"]: e["batch"] for e in plan["plan"]}
                jobs = {"even": ranks({r: a.batch for r in range(world)}), "planned": ranks(planned)}
                for name in ("slow", "fast"):
                    jobs[name] = [{"BENCH_PER_SAMPLE": str(speed[r]), "BENCH_BATCH": str(a.batch),
                                   "BENCH_BACKEND": "gloo"} for r in range(world) if island[r] == name]
                thr: dict[str, list[float]] = {k: [] for k in jobs}
                order = list(jobs)
                for rep in range(a.reps):
                    for k in order[rep % len(order):] + order[:rep % len(order)]:
                        thr[k].append(_run(jobs[k], base, tmp=tmp)[0])
                med = {k: statistics.median(v) for k, v in thr.items()}
                even_thr, plan_thr, alone = med["even"], med["planned"], med["slow"] + med["fast"]
                rows.append({"world": world, "ratio": ratio, "half": half, "split": [planned[r] for r in range(world)],
                             "even": even_thr / alone, "planned": plan_thr / alone,
                             "pred_even": plan["eta_mix_even"], "pred_planned": plan["eta_mix_planned"],
                             "alone": alone, "even_thr": even_thr, "plan_thr": plan_thr})
                print(f"world {world} ratio {ratio:g}: eta_mix even {even_thr / alone:.3f} planned "
                      f"{plan_thr / alone:.3f} (split {rows[-1]['split']})", file=sys.stderr, flush=True)
    print(f"backend {a.backend}; {a.per_sample * 1e3:g} ms per sample on the fast island, batch {a.batch} per rank "
          f"even, {a.steps} steps, gradient {a.grad * 4 // 1024} KiB, median of {a.reps} runs\n")
    print("| ranks (islands) | speed | planned split (slow, fast, ...) | samples/s alone (sum) | eta_mix even "
          "| eta_mix planned | hetobs plan predicted (even / planned) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['world']} ({r['half']}+{r['half']}) | {r['ratio']:g}:1 | {', '.join(map(str, r['split']))} "
              f"| {r['alone']:.1f} | {r['even']:.3f} | {r['planned']:.3f} | {r['pred_even']:.3f} / "
              f"{r['pred_planned']:.3f} |")


if __name__ == "__main__":
    main()
