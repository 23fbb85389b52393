"""Run the benchmark: start a job per backend, drive them size by size, collect the timings.

Design:

* One long-lived job per backend ("hetobs-shm", "hetobs-tcp", "gloo", ...): a
  process per rank running `python -m hetobs.bench.worker`, driven with one JSON
  line per command (workers.py; the backends and their jobs in backends.py, Open
  MPI's under mpirun in mpi_job.py). Start-up cost (torch import, rendezvous) is
  paid once, and an idle job blocks reading its commands, so it takes no CPU while
  another backend is measured.
* Interleaving: for every repetition, for every size, each backend runs one batch
  in turn (the order rotates per repetition, so no backend always comes first
  after a switch). Drift of the machine over the run therefore hits every backend
  alike, and the repetitions of one (backend, size) are spread over the whole run.
* Timing is barrier-free, as in nccl-tests: each rank times a batch of `iters`
  back-to-back ops after `warmup` untimed ones and reports the batch average. A
  (backend, size) time is the max over ranks of each rank's median over
  repetitions.
* Bandwidth follows nccl-tests exactly (units.py); the table's rows are made in
  rows.py.

Nothing here prints or exits: failures come back in `BenchResult.failures`, and
progress goes to an optional callback.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any, Callable

from .backends import BACKENDS, backend_job, backend_unavailable
from .config import BenchConfig, Progress
from .copy_probe import CopyRates, measure_copies
from .rows import BenchResult, Plan, Samples, table_rows
from .units import DTYPES, MiB, element_count, format_size, plan_iters
from .workers import BenchError, WorkerJob

__all__ = ["measure_memcpy", "run_bench"]


def measure_memcpy(nbytes: int = 256 * MiB, repeats: int = 5) -> float:
    """Best-of-`repeats` numpy copy bandwidth of this machine, in GB/s copied (1e9 bytes/s)."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)  # both written: pages faulted before timing
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def run_bench(config: BenchConfig, progress: Callable[[Progress], None] | None = None) -> BenchResult:
    """Run the benchmark described by `config` and return its rows (never prints or exits).

    Backends that cannot run here are listed in `skipped`; ones that fail while running
    in `failures` (their job is stopped, the other backends go on).
    """
    cfg = config.resolved()
    assert cfg.reps is not None and cfg.sizes is not None and cfg.memcpy_bytes is not None
    t_start = time.monotonic()
    n = cfg.ranks
    itemsize, type_name = DTYPES[cfg.dtype]

    def tell(done: int, total: int, message: str) -> None:
        if progress is not None:
            progress(Progress(done, total, message))

    skipped = {b: why for b in cfg.backends if (why := backend_unavailable(b)) is not None}
    failures: dict[str, str] = {}
    info: dict[str, dict[str, Any]] = {}

    # sizes as they will really run, duplicates (after rounding) dropped
    plan: Plan = []
    seen: set[int] = set()
    for s in cfg.sizes:
        count = element_count(cfg.op, s, n, itemsize)
        if count in seen:
            continue
        seen.add(count)
        plan.append((count * itemsize, count, *plan_iters(count * itemsize, cfg.quick)))

    memcpy_gbs = None
    copies: CopyRates | None = None
    if cfg.memcpy_bytes > 0:
        tell(0, 0, f"measuring memcpy bandwidth ({format_size(cfg.memcpy_bytes)} copy)")
        copies = measure_copies()  # first: right after freeing the big copy's buffers it read up to 2x low
        memcpy_gbs = measure_memcpy(cfg.memcpy_bytes)

    workdir = tempfile.mkdtemp(prefix="hetobs-bench-")
    jobs: dict[str, WorkerJob] = {}
    samples: Samples = {}
    cpu: Samples = {}  # the same shape: each batch's CPU seconds per op
    try:
        for b in cfg.backends:
            if b in skipped:
                continue
            tell(0, 0, f"starting {b} ({n} ranks)")
            job = backend_job(b, cfg, workdir)
            jobs[b] = job
            try:
                job.start(cfg.start_timeout_s)
            except BenchError as e:
                failures[b] = str(e)
                job.close(graceful=False)
                continue
            info[b] = {"ready": job.ready}
            samples[b] = [[[] for _ in range(n)] for _ in plan]
            cpu[b] = [[[] for _ in range(n)] for _ in plan]

        live = [b for b in cfg.backends if b in samples]
        total = cfg.reps * len(plan) * len(live)
        done = 0
        for rep in range(cfg.reps):
            order = live[rep % len(live):] + live[:rep % len(live)] if live else []
            for i, (nbytes, count, warmup, iters) in enumerate(plan):
                for b in order:
                    if b in failures:
                        continue
                    tell(done, total, f"rep {rep + 1}/{cfg.reps}  {format_size(nbytes):>9}  {b}")
                    msg = {"cmd": "run", "count": count, "warmup": warmup, "iters": iters,
                           "check": cfg.check and rep == 0}
                    try:
                        replies = jobs[b].request(msg, cfg.timeout_s, f"{cfg.op} of {nbytes} bytes")
                    except BenchError as e:
                        failures[b] = str(e)
                        jobs[b].close(graceful=False)
                    else:
                        for r, reply in enumerate(replies):
                            samples[b][i][r].append(float(reply["seconds"]))
                            cpu[b][i][r].append(float(reply["cpu_seconds"]))
                    done += 1
        tell(total, total, "done")
    finally:
        for b, job in jobs.items():
            if b not in failures:
                byes = job.close()
                if byes and b in info:
                    info[b]["exit"] = byes
        shutil.rmtree(workdir, ignore_errors=True)

    rows = table_rows(cfg, plan, samples, memcpy_gbs, type_name, cpu, copies)
    notes = []
    for b, about in info.items():
        want = BACKENDS[b][1]
        if want in ("shm", "tcp"):
            used = sorted({t for bye in about.get("exit", []) for t in bye.get("link_transports", [])})
            if used and used != [want]:
                notes.append(f"{b}: ranks reported links over {', '.join(used)}, not only {want}")
    return BenchResult(config=cfg, rows=rows, memcpy_gbs=memcpy_gbs, copies=copies, failures=failures, skipped=skipped,
                       info=info, notes=notes, wall_s=time.monotonic() - t_start)
