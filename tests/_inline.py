"""Run a short inline program as N real rank processes (for tests whose rank body is a few lines).

The body sees RANK/WORLD_SIZE/MASTER_*/HETOBS_* like any launched rank. Every process
is started in its own session and killed (with its group) when the job ends or fails;
segments of ranks that had to be killed are removed from /dev/shm.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from _launch import free_port

__all__ = ["InlineJob", "RankRun", "incident_ranks", "loop_program", "wait_until"]


@dataclass
class RankRun:
    rank: int
    returncode: int | None
    stdout: str
    stderr: str


class InlineJob:
    def __init__(self, body: str, world: int, tmp: Path, *, env: Mapping[str, str] | None = None,
                 rank_env: Mapping[int, Mapping[str, str]] | None = None, transport: str = "shm",
                 prefix: Sequence[Sequence[str]] | None = None, master_addr: str = "127.0.0.1",
                 unset: Sequence[str] = ()) -> None:
        self.job_id = f"i{uuid.uuid4().hex[:11]}"
        self.dir = tmp / "hetobs"
        self.procs: list[subprocess.Popen[str]] = []
        port = str(free_port())
        for r in range(world):
            e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR=master_addr, MASTER_PORT=port,
                     HETOBS_JOB_ID=self.job_id, HETOBS_DIR=str(self.dir), HETOBS_TRANSPORT=transport,
                     HETOBS_TIMEOUT="20", HETOBS_CONNECT_TIMEOUT="10", HETOBS_DEBUG="WARN", PYTHONUNBUFFERED="1",
                     OMP_NUM_THREADS="1")
            e.pop("HETOBS_SECRET", None)
            e.update(env or {})
            e.update((rank_env or {}).get(r, {}))
            for name in unset:  # e.g. the torchrun variables, for a job that another launcher's must start
                e.pop(name, None)
            argv = [*(prefix[r] if prefix else []), sys.executable, "-c", body]
            self.procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                               text=True, start_new_session=True))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait(self, timeout: float = 60.0) -> list[RankRun]:
        end = time.monotonic() + timeout
        runs = []
        try:
            for r, p in enumerate(self.procs):
                out, err = p.communicate(timeout=max(0.1, end - time.monotonic()))
                runs.append(RankRun(r, p.returncode, out, err))
        finally:
            self.kill()
        return runs

    def wait_line(self, rank: int, prefix: str, timeout: float = 90.0) -> str:
        """Read `rank`'s output until a line starts with `prefix` (the rank says it got there);
        fail naming the rank if it exits first or the line does not come in `timeout` s."""
        p = self.procs[rank]
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = p.stdout.readline()  # type: ignore[union-attr]
            if line.startswith(prefix):
                return line
            if not line and p.poll() is not None:
                raise AssertionError(f"rank {rank} exited ({p.returncode}) before printing {prefix!r}: "
                                     f"{p.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        raise AssertionError(f"rank {rank} did not print {prefix!r} in {timeout} s")

    def kill(self) -> None:
        killed = False
        for p in self.procs:
            if p.poll() is None:
                killed = True
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.communicate()
        for name in os.listdir("/dev/shm") if killed or any(p.returncode for p in self.procs) else []:
            if name.startswith(f"hetobs-stats-{self.job_id}-"):
                os.unlink(os.path.join("/dev/shm", name))

    def __enter__(self) -> "InlineJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def loop_program(step: str, *, setup: str = "", stop: str, finish: str = "") -> str:
    """A rank program that runs `step` (Python, with the round number `i`, the communicator
    `comm` and numpy as `np`) round after round until the file `stop` exists, agreed through a
    tiny all_reduce so every rank runs the same rounds. It prints STARTED after its first
    round, then OPS <rounds> and LINKS <reconnects per link>; on a PeerError FAILED <monotonic
    time> <type> <message> and exit status 3. `setup` runs once after init, `finish` after the
    loop's last line, before the communicator closes."""
    return _LOOP.format(stop=stop, setup=textwrap.dedent(setup).strip("\n"),
                        step=textwrap.indent(textwrap.dedent(step).strip("\n"), " " * 8),
                        finish=textwrap.dedent(finish).strip("\n"))


_LOOP = """
import os, sys, time, numpy as np, hetobs
stop = {stop!r}
comm = hetobs.init()
flag = np.zeros(1, np.float32)
{setup}
i = 0
try:
    while True:
{step}
        if i == 0:
            print("STARTED", flush=True)
        flag[0] = float(os.path.exists(stop))
        comm.all_reduce(flag, op="max")
        i += 1
        if flag[0]:
            break
except hetobs.PeerError as e:
    print("FAILED", time.monotonic(), type(e).__name__, str(e).replace(chr(10), " "), flush=True)
    sys.exit(3)
print("OPS", i, flush=True)
print("LINKS", [l["reconnects"] for l in comm.links()], flush=True)
{finish}
comm.close()
"""


def wait_until(pred, timeout: float, what: str) -> None:
    """Poll `pred` (a file appearing, dumps landing) until it holds; fail naming `what`."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def incident_ranks(job: InlineJob) -> dict[str, set[int]]:
    """incident id -> the ranks whose dump of it is in the job directory so far."""
    base = job.dir / job.job_id / "incidents"
    out: dict[str, set[int]] = {}
    for inc in os.listdir(base) if base.exists() else []:
        out[inc] = {int(f[5:-5]) for f in os.listdir(base / inc) if f.startswith("rank-") and f.endswith(".json")}
    return out
