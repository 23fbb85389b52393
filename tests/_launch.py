"""Launch multi-process hetobs jobs for tests: real processes, real sockets.

A job is N rank processes of ``python tests/rank_programs.py <program> <json-args>``,
each with the torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
and the HETOBS_* settings. Ranks talk back to the test in two ways, neither of which
is stdout:

* a result file: JSON written atomically by the rank when its program returns
  (``HETOBS_TEST_RESULT``);
* an event pipe: JSON lines the rank writes while it runs (``HETOBS_TEST_EVENT_FD``),
  which the test waits on with a deadline (``Job.wait_event``) — e.g. "I am looping
  now", or "my listener is at (host, port)". This is the synchronisation for fault
  injection: nothing here sleeps and hopes.

Ranks can also be held at *gates* (named FIFOs made by the launcher, see
``rank_programs.gate_wait``); the test or another rank opens them.

Every rank is started in its own session (process group); ``Job.kill`` / ``Job.close``
SIGKILL each group, so nothing outlives a failed test. Each rank also arms
``faulthandler`` to dump every thread's stack to stderr shortly before the launcher's
deadline, so a hang shows where it hung.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hetobs.launch_local import LocalJob
from hetobs.ports import free_port

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
RANK_PROGRAMS = TESTS_DIR / "rank_programs.py"
SHM_DIR = Path("/dev/shm")

DEFAULT_TIMEOUT = 3.0          # HETOBS_TIMEOUT
DEFAULT_CONNECT_TIMEOUT = 3.0  # HETOBS_CONNECT_TIMEOUT
DEFAULT_DEADLINE = 120.0       # whole job, seconds


def new_job_id(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def shm_entries() -> set[str]:
    try:
        return set(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return set()


def open_fds(pid: int | str = "self") -> set[int]:
    return {int(x) for x in os.listdir(f"/proc/{pid}/fd")}


@dataclass
class RankResult:
    rank: int
    pid: int
    returncode: int | None          # None: still running when collected (killed afterwards)
    result: dict[str, Any] | None   # the rank's JSON result, None if it never wrote one
    stderr: str
    stdout: str
    events: list[dict[str, Any]]
    killed_by_test: bool = False

    def describe(self) -> str:
        res = json.dumps(self.result, indent=1)[:4000] if self.result is not None else "<no result file>"
        return (f"--- rank {self.rank} (pid {self.pid}) exit={self.returncode}"
                f"{' [killed by test]' if self.killed_by_test else ''}\n"
                f"result: {res}\n"
                f"stderr (tail):\n{self.stderr[-6000:]}\n"
                f"stdout (tail):\n{self.stdout[-2000:]}")


@dataclass
class JobResult:
    job_id: str
    ranks: list[RankResult]
    timed_out: bool
    elapsed: float

    @property
    def results(self) -> list[dict[str, Any] | None]:
        return [r.result for r in self.ranks]

    def describe(self) -> str:
        head = f"job {self.job_id}: {'TIMED OUT, ' if self.timed_out else ''}{self.elapsed:.1f}s"
        return "\n".join([head] + [r.describe() for r in self.ranks])

    def check(self, ranks: Iterable[int] | None = None) -> list[dict[str, Any]]:
        """Assert the given ranks (default all not killed by the test) exited 0 with a result;
        return their results."""
        wanted = [r for r in self.ranks if (r.rank in ranks if ranks is not None else not r.killed_by_test)]
        bad = [r for r in wanted if r.returncode != 0 or r.result is None]
        if self.timed_out or bad:
            raise AssertionError("job failed:\n" + self.describe())
        return [r.result for r in wanted]  # type: ignore[misc]


class JobTimeout(AssertionError):
    pass


class Job:
    """N rank processes of one program. Use as a context manager (or via the `launcher` fixture)."""

    def __init__(self, program: str, world_size: int, args: Mapping[str, Any] | None = None, *,
                 workdir: Path, transport: str = "tcp", timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, deadline: float = DEFAULT_DEADLINE,
                 env: Mapping[str, str] | None = None, rank_env: Mapping[int, Mapping[str, str]] | None = None,
                 gates: Sequence[str] = (), job_id: str | None = None, master_port: int | None = None,
                 start_barrier: bool = True) -> None:
        if not 1 <= world_size <= 5:
            raise ValueError("tests launch 1..5 ranks")
        self.program = program
        self.world_size = world_size
        self.args = dict(args or {})
        self.job_id = job_id or new_job_id()
        self.workdir = Path(workdir) / self.job_id
        self.hetobs_dir = self.workdir / "hetobs"
        self.gate_dir = self.workdir / "gates"
        self.result_dir = self.workdir / "results"
        self.log_dir = self.workdir / "logs"
        for d in (self.hetobs_dir, self.gate_dir, self.result_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        # start barrier: every rank imports what it needs (numpy, hetobs, torch), reports "ready"
        # and waits at its start gate; start() opens them all at once, so slow imports on a
        # loaded machine do not eat into HETOBS_CONNECT_TIMEOUT.
        self.start_barrier = start_barrier
        start_gates = [f"start-{r}" for r in range(world_size)] if start_barrier else []
        for g in [*gates, *start_gates]:
            os.mkfifo(self.gate_dir / g)
        self.transport = transport
        self.deadline_s = deadline
        # the plumbing (environment, sessions, logs, kills) is the library's local launcher
        self.local = LocalJob(
            [sys.executable, str(RANK_PROGRAMS), program, json.dumps(self.args)], world_size,
            log_dir=self.log_dir, hetobs_dir=self.hetobs_dir, job_id=self.job_id, master_port=master_port,
            cwd=REPO_ROOT, rank_env=rank_env,
            env={
                "HETOBS_TRANSPORT": transport,
                "HETOBS_TIMEOUT": str(timeout),
                "HETOBS_CONNECT_TIMEOUT": str(connect_timeout),
                "HETOBS_TEST_GATES": str(self.gate_dir),
                "HETOBS_TEST_DEADLINE": str(deadline),
                "HETOBS_TEST_START_BARRIER": "1" if start_barrier else "",
                "PYTHONFAULTHANDLER": "1",
                # 2 cores, up to 5 ranks: keep numpy/torch from spawning thread pools
                "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "HETOBS_SECRET": None,
                **(env or {}),
            })
        self.master_port = self.local.master_port
        self.procs = self.local.procs
        self._event_fds: dict[int, int] = {}
        self._event_buf: dict[int, bytes] = {}
        self.events: dict[int, list[dict[str, Any]]] = {r: [] for r in range(world_size)}
        self.killed: dict[int, float] = {}   # rank -> time.monotonic() of SIGKILL
        self.t_start = 0.0
        self.collected: JobResult | None = None

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> "Job":
        self.t_start = time.monotonic()
        try:
            for r in range(self.world_size):
                rfd, wfd = os.pipe()
                os.set_blocking(rfd, False)
                self._event_fds[r] = rfd
                self._event_buf[r] = b""
                try:
                    self.local.spawn(r, {"HETOBS_TEST_T0": repr(self.t_start),
                                         "HETOBS_TEST_RESULT": str(self.result_dir / f"rank-{r}.json"),
                                         "HETOBS_TEST_EVENT_FD": str(wfd)}, pass_fds=(wfd,))
                finally:
                    os.close(wfd)
            if self.start_barrier:
                for r in range(self.world_size):
                    self.wait_event(r, "ready", timeout=max(self.remaining(), 1.0))
                for r in range(self.world_size):
                    self.gate_open(f"start-{r}", timeout=max(self.remaining(), 1.0))
        except BaseException:
            self.close()
            raise
        return self

    @property
    def pids(self) -> list[int]:
        return self.local.pids

    def remaining(self) -> float:
        return self.t_start + self.deadline_s - time.monotonic()

    def kill_rank(self, rank: int) -> float:
        """SIGKILL one rank (its whole process group); returns time.monotonic() of the kill."""
        t = self.killed[rank] = self.local.kill_rank(rank)
        return t

    def kill(self) -> None:
        """SIGKILL every rank's process group (idempotent)."""
        self.local.kill()

    def close(self) -> None:
        self.local.close()
        for fd in self._event_fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._event_fds.clear()

    def __enter__(self) -> "Job":
        return self if self.procs else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- events -----------------------------------------------------------------------
    def _pump(self, timeout: float) -> None:
        """Read whatever the event pipes hold, waiting at most `timeout` for something."""
        fds = list(self._event_fds.items())
        if not fds:
            return
        ready, _, _ = select.select([fd for _, fd in fds], [], [], max(0.0, timeout))
        for rank, fd in fds:
            if fd not in ready:
                continue
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:  # EOF: the rank exited (or closed the pipe)
                    os.close(fd)
                    del self._event_fds[rank]
                    break
                self._event_buf[rank] += chunk
            *lines, self._event_buf[rank] = self._event_buf[rank].split(b"\n")
            for line in lines:
                if line.strip():
                    self.events[rank].append(json.loads(line))

    def wait_event(self, rank: int, name: str, timeout: float = 30.0) -> dict[str, Any]:
        """Block until `rank` reports event `name`; raise JobTimeout (with every rank's output)
        if it does not within `timeout`, or if the rank exits without reporting it."""
        end = time.monotonic() + min(timeout, max(self.remaining(), 0.0))
        while True:
            for ev in self.events[rank]:
                if ev.get("event") == name:
                    return ev
            left = end - time.monotonic()
            if rank not in self._event_fds or left <= 0:
                why = "exited without reporting it" if rank not in self._event_fds else f"not within {timeout}s"
                res = self.collect()
                raise JobTimeout(f"rank {rank} never reported event {name!r} ({why})\n{res.describe()}")
            self._pump(left)

    def gate_open(self, name: str, timeout: float = 30.0) -> None:
        """Release the rank(s) blocked in gate_wait(name). Raises JobTimeout if none is waiting
        (a writer's open of a FIFO only succeeds once a reader holds it)."""
        path = self.gate_dir / name
        end = time.monotonic() + timeout
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:  # ENXIO: no reader yet
                if e.errno != 6:
                    raise
                if time.monotonic() > end or all(p.poll() is not None for p in self.procs):
                    raise JobTimeout(f"nobody waited at gate {name!r}\n{self.collect().describe()}")
                # wait for any rank activity (an event or an exit) instead of a blind sleep
                self._pump(0.05)
                continue
            try:
                os.write(fd, b"go\n")
            finally:
                os.close(fd)
            return

    # -- results ----------------------------------------------------------------------
    def _wait_loop(self, end: float, fail_fast: bool) -> bool:
        """Wait until every rank exited (or, with fail_fast, one exited non-zero); True on timeout."""
        while True:
            alive = [p for p in self.procs if p.poll() is None]
            if not alive:
                return False
            if fail_fast and any(p.returncode not in (None, 0) for p in self.procs):
                return False
            left = end - time.monotonic()
            if left <= 0:
                return True
            if self._event_fds:
                self._pump(min(left, 0.05))  # wakes on events and on EOF when a rank exits
            else:
                self.local.wait(left, fail_fast=fail_fast)

    def wait(self, timeout: float | None = None, *, fail_fast: bool = False) -> JobResult:
        """Wait for every rank to exit (at most `timeout`, default what is left of the job's
        deadline); then kill whatever still runs (all of them on timeout, or the rest once one
        failed with fail_fast). Returns per-rank exit codes, results, stderr and events."""
        end = time.monotonic() + (self.remaining() if timeout is None else timeout)
        timed_out = self._wait_loop(end, fail_fast)
        res = self.collect()
        res.timed_out = timed_out
        return res

    def collect(self) -> JobResult:
        """Kill whatever still runs, then gather everything the ranks left behind."""
        self.kill()
        while self._event_fds:
            self._pump(0.0)
            if self._event_fds and not select.select(list(self._event_fds.values()), [], [], 0)[0]:
                break
        ranks = []
        for r, p in enumerate(self.procs):
            result = None
            path = self.result_dir / f"rank-{r}.json"
            if path.exists():
                try:
                    result = json.loads(path.read_text())
                except ValueError as e:
                    result = {"unreadable_result": str(e)}
            ranks.append(RankResult(
                rank=r, pid=p.pid, returncode=p.returncode, result=result,
                stderr=self.local.log_path(r, "err").read_text(errors="replace"),
                stdout=self.local.log_path(r, "out").read_text(errors="replace"),
                events=list(self.events[r]), killed_by_test=r in self.killed))
        self.collected = JobResult(self.job_id, ranks, False, time.monotonic() - self.t_start)
        return self.collected

    def run(self) -> JobResult:
        """start() (if needed), wait(), close()."""
        if not self.procs:
            self.start()
        try:
            return self.wait()
        finally:
            self.close()

    # -- leftovers --------------------------------------------------------------------
    def shm_leftovers(self, before: set[str]) -> list[str]:
        """/dev/shm entries created since `before` that belong to this job (name holds the job id
        or one of its rank pids)."""
        out = []
        for name in shm_entries() - before:
            if self.job_id in name or any(re.search(rf"(?<!\d){pid}(?!\d)", name) for pid in self.pids):
                out.append(name)
        return sorted(out)


def run_job(program: str, world_size: int, args: Mapping[str, Any] | None = None, **kw: Any) -> JobResult:
    """One-shot: launch, wait with deadline, kill everything, return the result."""
    job = Job(program, world_size, args, **kw)
    return job.run()


@dataclass
class Stranger:
    """Result of a one-off helper process (e.g. a stranger probing a rank's listener)."""

    returncode: int
    result: dict[str, Any] | None
    stderr: str


def run_python(code: str, *, env: Mapping[str, str] | None = None, timeout: float = 30.0,
               workdir: Path) -> Stranger:
    """Run `code` in a fresh interpreter (own process group, killed on timeout). The code can
    write a JSON result with `emit(obj)`."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"py-{uuid.uuid4().hex[:8]}.json"
    prelude = (
        "import json, os\n"
        "def emit(obj):\n"
        f"    open({str(out)!r} + '.tmp', 'w').write(json.dumps(obj)); os.replace({str(out)!r} + '.tmp', {str(out)!r})\n"
    )
    full_env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    p = subprocess.Popen([sys.executable, "-c", prelude + code], env=full_env, cwd=str(REPO_ROOT),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    result = json.loads(out.read_text()) if out.exists() else None
    return Stranger(p.returncode, result, err.decode(errors="replace"))


__all__ = [
    "Job", "JobResult", "RankResult", "JobTimeout", "Stranger", "run_job", "run_python",
    "free_port", "new_job_id", "shm_entries", "open_fds", "DEFAULT_TIMEOUT", "DEFAULT_CONNECT_TIMEOUT",
]
