"""Launch a job of tests/telemetry_programs.py ranks and talk to them (events on stdout, commands on stdin).

Used by the telemetry tests and bench/scrape_bench.py. The ranks start on
hetobs.launch_local (own session each); `close()` SIGKILLs every process group still alive and removes the stats
segments the killed ranks left in /dev/shm. Also starts helper processes (the
exporter, Prometheus) the same way, so one `close()` ends everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetobs.launch_local import LocalJob
from hetobs.line_reader import LineEnd, LineReader, LineTimeout
from hetobs.ports import free_port  # noqa: F401  (for the tests that import it from here)

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
PROGRAMS = TESTS_DIR / "telemetry_programs.py"


def metric_by_rank(job_id: str, name: str) -> dict[int, float]:
    """{rank: value} of one metric family (summed over its other labels), read as the exporter
    serves it: from the live ranks' stats segments."""
    from hetobs.exporters.metrics import families
    from hetobs.exporters.source import ShmSource

    out: dict[int, float] = {}
    for fam in families(ShmSource(job_id).snapshot()):
        if fam.spec.name == name:
            for labels, value in fam.samples:
                out[int(labels[1])] = out.get(int(labels[1]), 0.0) + value
    return out


class RankJob:
    """N ranks of one program; `wait_event`, `send`, `stop_rank`, `close`."""

    def __init__(self, program: str, world: int, args: Mapping[str, Any] | None = None, *, workdir: Path,
                 env: Mapping[str, str] | None = None, programs: Path = PROGRAMS) -> None:
        self.job_id = f"tel{uuid.uuid4().hex[:10]}"
        self.world = world
        self.workdir = Path(workdir)
        self.hetobs_dir = self.workdir / "hetobs"
        self.hetobs_dir.mkdir(parents=True, exist_ok=True)
        self.local = LocalJob(
            [sys.executable, str(programs), program, json.dumps(dict(args or {}))], world, log_dir=self.workdir,
            hetobs_dir=self.hetobs_dir, job_id=self.job_id, cwd=REPO, stdin="pipe", stdout="pipe",
            env={"HETOBS_TRANSPORT": "shm", "HETOBS_DEBUG": "ERROR", "HETOBS_TIMEOUT": "120",
                 "HETOBS_CONNECT_TIMEOUT": "30", "OMP_NUM_THREADS": "1", "HETOBS_SECRET": None, **(env or {})})
        self.procs = self.local.procs
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.events: dict[int, list[dict[str, Any]]] = {r: [] for r in range(world)}
        self._logs: list[Any] = []
        self.killed = False
        self.local.start()
        self.lines = LineReader([p.stdout.fileno() for p in self.procs if p.stdout is not None])

    # -- events and commands ---------------------------------------------------------
    def _stderr(self) -> str:
        out = []
        for r in range(self.world):
            p = self.workdir / f"rank-{r}.err"
            out.append(f"--- rank {r} stderr:\n{p.read_text(errors='replace')[-3000:] if p.exists() else ''}")
        return "\n".join(out)

    def wait_event(self, rank: int, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """Block until `rank` prints event `name`; AssertionError (with stderr) on timeout or exit."""
        end = time.monotonic() + timeout
        while True:
            for ev in self.events[rank]:
                if ev.get("event") == name:
                    return ev
            try:
                line = self.lines.read([rank], max(0.0, end - time.monotonic()))[rank]
            except LineTimeout:
                raise AssertionError(f"rank {rank} did not report {name!r} within {timeout}s\n{self._stderr()}") \
                    from None
            except LineEnd:
                raise AssertionError(f"rank {rank} exited ({self.procs[rank].wait()}) before {name!r}\n"
                                     f"{self._stderr()}") from None
            if line.startswith(b"@@ "):
                self.events[rank].append(json.loads(line[3:]))

    def wait_all(self, name: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        return [self.wait_event(r, name, timeout) for r in range(self.world)]

    def send(self, line: str, ranks: Sequence[int] | None = None) -> None:
        for r in (range(self.world) if ranks is None else ranks):
            stdin = self.procs[r].stdin
            assert stdin is not None
            stdin.write(line.encode() + b"\n")
            stdin.flush()

    # -- helpers (exporter, prometheus) ------------------------------------------------
    def helper(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, log: str) -> subprocess.Popen[bytes]:
        """Start a helper process in its own session, stderr to `log` in the workdir; killed by close()."""
        err = open(self.workdir / log, "wb")
        self._logs.append(err)
        p = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, cwd=str(REPO), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        self.helpers.append(p)
        return p

    def log_text(self, log: str) -> str:
        p = self.workdir / log
        return p.read_text(errors="replace") if p.exists() else ""

    def wait_log(self, log: str, needle: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
        """Wait until `needle` appears in a helper's log (it flushes per line); returns the log."""
        end = time.monotonic() + timeout
        while True:
            text = self.log_text(log)
            if needle in text:
                return text
            if proc.poll() is not None:
                raise AssertionError(f"{log}: process exited ({proc.returncode}) before {needle!r}:\n{text[-3000:]}")
            if time.monotonic() > end:
                raise AssertionError(f"{log}: no {needle!r} within {timeout}s:\n{text[-3000:]}")
            time.sleep(0.02)  # polling a file the helper writes, with a deadline

    # -- teardown -------------------------------------------------------------------------
    def segments(self) -> list[str]:
        from hetobs import stats

        return stats.segment_paths(self.job_id)

    def close(self) -> None:
        self.killed = self.killed or any(p.poll() is None for p in self.procs + self.helpers)
        self.local.close()
        for p in self.helpers:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                pass
        for f in self._logs:
            f.close()
        self._logs.clear()
        for path in self.segments():  # left by ranks we killed
            try:
                os.unlink(path)
            except OSError:
                pass

    def __enter__(self) -> "RankJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
