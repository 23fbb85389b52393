"""Run a short inline program as N real rank processes (for tests whose rank body is a few lines).

The body sees RANK/WORLD_SIZE/MASTER_*/HETOBS_* like any launched rank (started by
hetobs.launch_local: own session each, killed with its group when the job ends or fails);
segments of ranks that had to be killed are removed from /dev/shm.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from hetobs.launch_local import LocalJob
from hetobs.line_reader import LineEnd, LineReader, LineTimeout

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
        gone: dict[str, str | None] = {name: None for name in unset}  # e.g. the torchrun variables, for a job
        # that another launcher's must start
        self.local = LocalJob(
            lambda r: [*(prefix[r] if prefix else []), sys.executable, "-c", body], world,
            log_dir=tmp / f"logs-{self.job_id}", hetobs_dir=self.dir, job_id=self.job_id, master_addr=master_addr,
            stdout="pipe",
            env={"HETOBS_TRANSPORT": transport, "HETOBS_TIMEOUT": "20", "HETOBS_CONNECT_TIMEOUT": "10",
                 "HETOBS_DEBUG": "WARN", "OMP_NUM_THREADS": "1", "HETOBS_SECRET": None, **(env or {})},
            rank_env={r: {**(rank_env or {}).get(r, {}), **gone} for r in range(world)})
        self.local.start()
        self.procs = self.local.procs
        # everything a rank prints is kept (wait() returns it whole)
        self.lines = LineReader([p.stdout.fileno() for p in self.procs if p.stdout is not None], keep=1 << 26)
        self.closed = False

    @property
    def pids(self) -> list[int]:
        return self.local.pids

    def wait(self, timeout: float = 60.0) -> list[RankRun]:
        """Every rank's exit status and output once all exited; raises TimeoutExpired (and kills
        them) when they have not within `timeout` s."""
        try:
            end = time.monotonic() + timeout
            self.lines.drain(timeout)  # reading as they print: a full pipe must not stall a rank
            if not self.local.wait(max(0.0, end - time.monotonic())):
                raise subprocess.TimeoutExpired(f"inline job {self.job_id}", timeout)
            return [RankRun(r, p.returncode, self.lines.seen(r), self.local.log_path(r).read_text(errors="replace"))
                    for r, p in enumerate(self.procs)]
        finally:
            self.kill()

    def read_line(self, rank: int, timeout: float, what: str) -> str:
        """`rank`'s next line of output (without its newline); fail naming the rank and `what` it
        was expected to print if it exits first or nothing comes in `timeout` s."""
        try:
            return self.lines.read([rank], max(0.0, timeout))[rank].decode(errors="replace")
        except LineEnd:
            code = self.procs[rank].wait()
            raise AssertionError(f"rank {rank} exited ({code}) before printing {what}: "
                                 f"{self.local.log_path(rank).read_text(errors='replace')[-3000:]}") from None
        except LineTimeout:
            raise AssertionError(f"rank {rank} did not print {what} in {timeout:.0f} s") from None

    def wait_line(self, rank: int, prefix: str, timeout: float = 90.0) -> str:
        """Read `rank`'s output until a line starts with `prefix` (the rank says it got there)."""
        end = time.monotonic() + timeout
        while not (line := self.read_line(rank, end - time.monotonic(), repr(prefix))).startswith(prefix):
            pass
        return line + "\n"

    def kill(self) -> None:
        if self.closed:
            return
        self.closed = True
        killed = any(p.poll() is None for p in self.procs)
        self.local.kill()
        self.lines.drain(timeout=5)  # what they printed last, before the pipes close
        self.local.close()
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
