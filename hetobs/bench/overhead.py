"""The cost of watching: a DDP training step on plain Gloo against the same step watched by hetobs.

`run_overhead(OverheadConfig(...))` starts one long-lived job (a process per rank, see
hetobs/bench/ddp_worker.py) per variant and world size, then runs rounds: in each, every
variant times one batch of steps in turn, the order rotating round by round, so drift of
the machine hits all alike while the idle jobs block on their stdin. A round's step time is
the slowest rank's median step of the batch (a median: a step the scheduler preempted does
not count); a variant's is the median over rounds, and its overhead that against plain
Gloo's in the same run. CPU per step (every thread of every rank, plus the exporter's
process for the scraped variant) is reported beside it: on a shared machine it moves less
than wall time, though it cannot show lost overlap.

Variants:
- gloo: `init_process_group("gloo")`, the baseline;
- hetobs_gloo: "hetobs_gloo" through the C++ wrapper (hetobs._torch_ext), recording and
  watchdog on (the defaults);
- hetobs_gloo_py: the same through the Python fallback (HETOBS_TORCH_NATIVE=0);
- hetobs_gloo_scraped: hetobs_gloo with `hetobs exporter` serving the job and scraped
  once a second while the variant runs (the exporter reads the ranks' stats segments from
  its own process: its CPU is what the ranks may lose);
- hetobs: the native transport as the torch backend.

This module never prints or exits; `hetobs bench overhead` (cli/bench.py) renders it.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Callable

from ..launch_local import new_job_id
from .workers import BenchError, LocalWorkers

__all__ = ["VARIANTS", "OverheadConfig", "OverheadRow", "OverheadResult", "run_overhead"]

# variant -> (torch backend, environment, the wrapper its ranks must report)
VARIANTS: dict[str, tuple[str, dict[str, str], str]] = {
    "gloo": ("gloo", {}, "none"),
    "hetobs_gloo": ("hetobs_gloo", {"HETOBS_TORCH_NATIVE": "1"}, "c++"),
    "hetobs_gloo_py": ("hetobs_gloo", {"HETOBS_TORCH_NATIVE": "0"}, "python"),
    "hetobs_gloo_scraped": ("hetobs_gloo", {"HETOBS_TORCH_NATIVE": "1"}, "c++"),
    "hetobs": ("hetobs", {}, "none"),
}
SCRAPE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class OverheadConfig:
    world_sizes: tuple[int, ...] = (2, 4)
    variants: tuple[str, ...] = tuple(VARIANTS)
    rounds: int = 7
    steps: int = 30  # timed steps per batch
    timeout_s: float = 300.0  # one batch
    start_timeout_s: float = 180.0

    def check(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
        if "gloo" not in self.variants:
            raise ValueError("the variants must include gloo: overheads are measured against it")
        if not self.world_sizes or min(self.world_sizes) < 1:
            raise ValueError("world sizes must be at least 1")
        if self.rounds < 1 or self.steps < 1:
            raise ValueError("rounds and steps must be at least 1")


@dataclass
class OverheadRow:
    variant: str
    ranks: int
    step_ms: float  # median over rounds of the slowest rank's median step
    overhead: float | None  # step_ms / gloo's step_ms - 1 (None for gloo itself)
    cpu_ms: float  # median over rounds of CPU ms per step, all ranks (and the exporter) together
    cpu_overhead: float | None
    rounds_ms: list[float] = field(default_factory=list)  # each round's step time, in run order
    scrapes: int = 0  # exporter scrapes answered during the variant's batches

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class OverheadResult:
    config: OverheadConfig
    rows: list[OverheadRow] = field(default_factory=list)
    loadavg: list[tuple[float, float, float]] = field(default_factory=list)  # before and after each world size
    params: int = 0


class _DdpJob(LocalWorkers):
    """One variant's ranks (hetobs/bench/ddp_worker.py) at one world size."""

    def __init__(self, variant: str, ranks: int, workdir: str) -> None:
        backend, extra, self.wrapper = VARIANTS[variant]
        env: dict[str, str | None] = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                                      "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"), **extra}
        super().__init__(variant, [sys.executable, "-m", "hetobs.bench.ddp_worker", "--backend", backend], ranks,
                         log_dir=os.path.join(workdir, f"n{ranks}"), hetobs_dir=os.path.join(workdir, "hetobs"),
                         job_id=new_job_id(f"ovh-{variant}-{ranks}-"), env=env)
        self.job_id = self.local.job_id
        self.hetobs_dir = str(self.local.hetobs_dir)

    def start(self, timeout: float) -> None:
        super().start(timeout)
        got = {x.get("wrapper") for x in self.ready}
        if got != {self.wrapper}:
            raise BenchError(f"{self.name}: ranks run the {', '.join(sorted(map(str, got)))} wrapper, "
                             f"expected {self.wrapper}" + self._tails([0]))


class _Scraper:
    """`hetobs exporter` for one job, scraped every SCRAPE_INTERVAL_S between begin() and end()."""

    def __init__(self, job: _DdpJob, workdir: str) -> None:
        self.log = os.path.join(workdir, f"exporter-{job.job_id}.log")
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "hetobs.cli", "exporter", "--job", job.job_id,
                                          "--port", "0", "--dir", job.hetobs_dir], stdout=subprocess.DEVNULL,
                                         stderr=err, env=dict(os.environ, COLUMNS="300"))
        self.cond = threading.Condition()
        self.active = self.stop = self.busy = False
        self.started = self.scrapes = 0
        self.failure: str | None = None
        self.url = self._address()
        self.thread = threading.Thread(target=self._loop, name="hetobs-bench-scraper", daemon=True)
        self.thread.start()

    def _address(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                m = re.search(r"(http://\S+/metrics)", f.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)  # polling a log file for a line another process writes
        self.close()
        with open(self.log, encoding="utf-8", errors="replace") as f:
            raise BenchError(f"hetobs exporter did not start serving: {f.read()[-2000:]}")

    def begin(self) -> None:
        """Start scraping; returns once the first scrape is under way (so it overlaps the batch)."""
        with self.cond:
            first = self.started + 1
            self.active = True
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: self.started >= first or self.failure is not None, timeout=60):
                self.failure = "the scraper did not start"

    def end(self) -> None:
        """Stop scraping; returns once no scrape is in flight."""
        with self.cond:
            self.active = False
            self.cond.notify_all()
            self.cond.wait_for(lambda: not self.busy, timeout=60)

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.active or self.stop)
                if self.stop:
                    return
                self.busy = True
                self.started += 1
                self.cond.notify_all()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    body = r.read()
                if b"hetobs_collective_bytes_total" not in body:
                    self.failure = "a scrape had no hetobs_collective_bytes_total"
            except OSError as e:
                self.failure = f"scrape of {self.url} failed: {e}"
            with self.cond:
                self.busy = False
                self.scrapes += 1
                self.cond.notify_all()
                # The next scrape a second later, unless end() or close() comes first.
                self.cond.wait_for(lambda: not self.active or self.stop, timeout=SCRAPE_INTERVAL_S)

    def close(self) -> None:
        if hasattr(self, "thread"):
            with self.cond:
                self.stop = True
                self.cond.notify_all()
            self.thread.join(timeout=15)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def mlp_parameters() -> int:
    from .ddp_worker import LAYERS

    return sum(a * b + b for a, b in pairwise(LAYERS))


def run_overhead(cfg: OverheadConfig, progress: Callable[[str], None] | None = None) -> OverheadResult:
    """Interleaved rounds of every variant for every world size (see the module docstring)."""
    cfg.check()
    tell = progress or (lambda _msg: None)
    result = OverheadResult(config=cfg, params=mlp_parameters())
    with tempfile.TemporaryDirectory(prefix="hetobs-overhead-") as workdir:
        for n in cfg.world_sizes:
            result.loadavg.append(os.getloadavg())
            result.rows += _one_world(cfg, n, workdir, tell)
            result.loadavg.append(os.getloadavg())
    return result


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (the exporter's, measured from outside)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _one_world(cfg: OverheadConfig, n: int, workdir: str, tell: Callable[[str], None]) -> list[OverheadRow]:
    jobs: dict[str, _DdpJob] = {}
    scraper: _Scraper | None = None
    wall: dict[str, list[float]] = {v: [] for v in cfg.variants}
    cpu: dict[str, list[float]] = {v: [] for v in cfg.variants}
    scrapes: dict[str, int] = dict.fromkeys(cfg.variants, 0)
    try:
        for v in cfg.variants:
            tell(f"{n} ranks: starting {v}")
            job = jobs[v] = _DdpJob(v, n, workdir)
            job.start(cfg.start_timeout_s)
            if v == "hetobs_gloo_scraped":
                scraper = _Scraper(job, workdir)
        order = list(cfg.variants)
        for i in range(cfg.rounds):
            k = i % len(order)
            for v in order[k:] + order[:k]:
                tell(f"{n} ranks: round {i + 1}/{cfg.rounds}: {v}")
                watched = scraper if v == "hetobs_gloo_scraped" else None
                if watched is not None:
                    before, exporter_cpu = watched.scrapes, _cpu_seconds(watched.proc.pid)
                    watched.begin()
                replies = jobs[v].request({"cmd": "run", "steps": cfg.steps}, cfg.timeout_s, f"round {i + 1}")
                extra_cpu = 0.0
                if watched is not None:
                    watched.end()
                    scrapes[v] += watched.scrapes - before
                    extra_cpu = _cpu_seconds(watched.proc.pid) - exporter_cpu
                    if watched.failure:
                        raise BenchError(f"{v}: {watched.failure}")
                wall[v].append(max(statistics.median(x["steps"]) for x in replies) * 1e3)
                cpu[v].append((sum(float(x["cpu_seconds"]) for x in replies) + extra_cpu) / cfg.steps * 1e3)
        for v, job in jobs.items():
            byes = job.close()
            if VARIANTS[v][0] != "gloo" and byes and not any(int(b.get("records", 0)) for b in byes):
                raise BenchError(f"{v}: hetobs recorded no op: the variant ran unwatched")
        jobs.clear()
    finally:
        if scraper is not None:
            scraper.close()
        for job in jobs.values():
            job.close(graceful=False)
    base, base_cpu = statistics.median(wall["gloo"]), statistics.median(cpu["gloo"])
    rows = []
    for v in cfg.variants:
        med, med_cpu = statistics.median(wall[v]), statistics.median(cpu[v])
        rows.append(OverheadRow(variant=v, ranks=n, step_ms=med, overhead=None if v == "gloo" else med / base - 1,
                                cpu_ms=med_cpu, cpu_overhead=None if v == "gloo" else med_cpu / base_cpu - 1,
                                rounds_ms=wall[v], scrapes=scrapes[v]))
    return rows
