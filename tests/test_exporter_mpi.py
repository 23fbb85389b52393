"""A real Prometheus scrapes `hetobs exporter` while an MPI job runs under the preload:
the MPI interposer writes the same stats segment as native ranks, so the same metrics
hold: byte totals equal what the ranks moved, and a stopped rank's
hetobs_seconds_since_progress rises while scrapes keep succeeding."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_exporter_prometheus import Prom, _by, _start_exporter  # noqa: E402

from hetobs import stats  # noqa: E402
from hetobs.bench.mpi_shm import MpiShmDir  # noqa: E402
from hetobs.preload import library_path  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("mpicc") and shutil.which("mpirun")),
    reason="needs Debian's prometheus and Open MPI (scripts/setup.sh installs both)")]

NP, ROUNDS, COUNT = 3, 5, 1024  # doubles per all_reduce

PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  static double x[%(count)d], y[%(count)d];
  for (int i = 0; i < %(rounds)d; ++i) MPI_Allreduce(x, y, %(count)d, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  printf("phase1 %%d %%d\n", rank, (int)getpid()); fflush(stdout);
  while (access(argv[1], F_OK) != 0) usleep(20000);  /* the test's signal to loop */
  for (;;) MPI_Allreduce(x, y, %(count)d, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}
"""


class MpiJob:
    """The few things Prom and _start_exporter need from a job, for an mpirun job."""

    def __init__(self, tmp: Path) -> None:
        self.workdir = tmp
        self.job_id = f"mpiexp{uuid.uuid4().hex[:8]}"
        self.hetobs_dir = tmp / "hetobs"
        self.helpers: list[subprocess.Popen[bytes]] = []
        src = tmp / "loop.c"
        src.write_text(PROGRAM % {"count": COUNT, "rounds": ROUNDS})
        subprocess.run(["mpicc", "-o", str(tmp / "loop"), str(src)], check=True)
        self.go = tmp / "go"
        self.out = open(tmp / "mpirun.out", "wb")
        self.shm = MpiShmDir()
        self.mpirun = subprocess.Popen(
            ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(NP), *self.shm.mca_args(), "-x", f"LD_PRELOAD={library_path('mpi')}",
             "-x", "HETOBS_JOB_ID", "-x", "HETOBS_DIR", "-x", "HETOBS_HANG_TIMEOUT", str(tmp / "loop"), str(self.go)],
            env={**os.environ, "HETOBS_JOB_ID": self.job_id, "HETOBS_DIR": str(self.hetobs_dir),
                 "HETOBS_HANG_TIMEOUT": "3"}, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)

    def pids(self, timeout: float = 60) -> dict[int, int]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            lines = [ln.split() for ln in (self.workdir / "mpirun.out").read_text().splitlines()
                     if ln.startswith("phase1")]
            if len(lines) == NP:
                return {int(r): int(p) for _, r, p in lines}
            time.sleep(0.05)  # polling mpirun's output file, with a deadline
        raise AssertionError("ranks never reached phase 1: " + (self.workdir / "mpirun.out").read_text()[-2000:])

    def helper(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, log: str) -> Any:
        err = open(self.workdir / log, "wb")
        p = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=err,
                             start_new_session=True)
        self.helpers.append(p)
        return p

    def log_text(self, log: str) -> str:
        p = self.workdir / log
        return p.read_text(errors="replace") if p.exists() else ""

    def wait_log(self, log: str, needle: str, proc: Any, timeout: float = 30.0) -> str:
        end = time.monotonic() + timeout
        while needle not in (text := self.log_text(log)):
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"{log}: no {needle!r}:\n{text[-2000:]}")
            time.sleep(0.02)  # polling a file the helper writes, with a deadline
        return text

    def close(self) -> None:
        for p in [*self.helpers, self.mpirun]:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()
        self.shm.remove()
        for path in stats.segment_paths(self.job_id):
            os.unlink(path)
        self.out.close()


def test_prometheus_scrapes_an_mpi_job(tmp_path: Path) -> None:
    job = MpiJob(tmp_path)
    try:
        pids = job.pids()
        prom = Prom(job, _start_exporter(job), tmp_path)  # type: ignore[arg-type]
        sel = f'job_id="{job.job_id}"'
        want = float(ROUNDS * COUNT * 8)
        got = prom.until(lambda: (lambda r: r if len(r) == NP and set(r.values()) == {want} else None)(
            _by(prom.query(f"sum by (rank) (hetobs_collective_bytes_total{{{sel}}})"), "rank")),
            "per-rank byte totals of the MPI job")
        assert got == {(str(r),): want for r in range(NP)}
        job.go.touch()
        victim = pids[1]
        os.kill(victim, signal.SIGSTOP)
        q = f'hetobs_seconds_since_progress{{{sel},rank="1"}}'
        first = prom.until(lambda: (lambda v: v if v and v[("1",)] >= 1.0 else None)(_by(prom.query(q), "rank")),
                           "rank 1's seconds_since_progress past 1 s")[("1",)]
        prom.until(lambda: (lambda v: v if v and v[("1",)] >= first + 2.0 else None)(_by(prom.query(q), "rank")),
                   "rank 1's seconds_since_progress rising")
        assert _by(prom.query('up{job="hetobs"}'), "job") == {("hetobs",): 1.0}
        assert _by(prom.query(f"hetobs_rank_up{{{sel}}}"), "rank") == {(str(r),): 1.0 for r in range(NP)}
    finally:
        job.close()
