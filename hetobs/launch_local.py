"""Start the N rank processes of one job on this host, and leave none of them behind.

Every local launcher in hetobs (the demo, `hetobs bench` with its relay and overhead
benchmarks, local checks, the test suite's launcher) starts ranks the same way, so the
plumbing lives here once:

* the environment of rank r: torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
  LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one HETOBS_JOB_ID and HETOBS_DIR for the
  job, then the caller's variables for the job and for the rank (None removes one). The
  rendezvous port comes from hetobs.ports.free_port: outside the kernel's ephemeral range,
  so no rank's own listener can take it between choice and bind;
* each rank in a session (process group) of its own, so one killpg ends it and whatever
  it started, and a terminal's Ctrl-C reaches the launcher, which then kills them all;
  stdin closed unless the caller talks to the rank; stderr, and stdout unless the caller
  reads it as a pipe, in a log file per rank;
* `close()` (also on an exception, used as a context manager) SIGKILLs every rank's group
  and reaps it; `wait()` has a deadline; `exits()` says how each rank ended, with the end
  of what it wrote.

What a launcher says to its ranks (JSON lines, events, gates) stays with that launcher;
hetobs.line_reader reads lines from the ranks' pipes with a deadline.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Literal, Mapping, Optional, Sequence, Union

from .ports import free_port

__all__ = ["LocalJob", "RankExit", "new_job_id", "tail_of", "torchrun_env"]

#: Variables to set (a string) or remove (None) in a rank's environment.
EnvChanges = Mapping[str, Optional[str]]
#: One command for every rank, or rank -> its command (a rank in a network namespace, ...).
Argv = Union[Sequence[str], Callable[[int], Sequence[str]]]

_TAIL_BYTES = 8192


def new_job_id(prefix: str = "local-") -> str:
    """A job id unique enough for one host's /dev/shm and job directories."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def torchrun_env(rank: int, world: int, *, master_addr: str, master_port: int, job_id: str, hetobs_dir: str | Path,
                 base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with torchrun's variables for rank `rank` of
    `world` ranks on this host and the job's HETOBS_JOB_ID and HETOBS_DIR."""
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), HETOBS_JOB_ID=job_id,
               HETOBS_DIR=str(hetobs_dir), PYTHONUNBUFFERED="1")
    return env


def _apply(env: dict[str, str], changes: EnvChanges | None) -> None:
    for k, v in (changes or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)


def tail_of(path: str | Path, lines: int = 12, max_bytes: int = _TAIL_BYTES) -> str:
    """The last `lines` lines of a file (read from its last `max_bytes`), "" when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class RankExit:
    """How one rank ended (or that it still runs), with the end of what it wrote."""

    rank: int
    pid: int
    returncode: int | None  # None: still running; negative: the signal that ended it
    killed: bool  # this launcher killed it (close, kill, kill_rank) before it exited by itself
    stderr_tail: str
    stdout_tail: str  # "" when the caller read stdout as a pipe (its reader keeps what it read)

    @property
    def failed(self) -> bool:
        return self.returncode not in (None, 0)


class LocalJob:
    """`world` rank processes of one job on this host (see the module docstring).

    stdin: "null" (closed) or "pipe" (`procs[r].stdin`, bytes). stdout: "log" (rank-R.out
    in `log_dir`), "merge" (into rank-R.err, with stderr) or "pipe" (`procs[r].stdout`,
    bytes; read it with hetobs.line_reader.LineReader). stderr always goes to rank-R.err.
    """

    def __init__(self, argv: Argv, world: int, *, log_dir: str | Path, hetobs_dir: str | Path,
                 job_id: str | None = None, master_addr: str = "127.0.0.1", master_port: int | None = None,
                 env: EnvChanges | None = None, rank_env: Mapping[int, EnvChanges] | None = None,
                 stdin: Literal["null", "pipe"] = "null", stdout: Literal["log", "merge", "pipe"] = "log",
                 log_prefix: str = "", cwd: str | Path | None = None) -> None:
        if world < 1:
            raise ValueError(f"world={world}: need at least one rank")
        self.argv = argv
        self.world = world
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.hetobs_dir = Path(hetobs_dir)
        self.job_id = job_id or new_job_id()
        self.master_addr = master_addr
        self.master_port = master_port or free_port()
        self.env = dict(env or {})
        self.rank_env = {int(r): dict(v) for r, v in (rank_env or {}).items()}
        self.stdin, self.stdout = stdin, stdout
        self.log_prefix = log_prefix
        self.cwd = cwd
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # -- start ----------------------------------------------------------------------------
    def env_of(self, rank: int) -> dict[str, str]:
        """The whole environment rank `rank` starts with."""
        env = torchrun_env(rank, self.world, master_addr=self.master_addr, master_port=self.master_port,
                           job_id=self.job_id, hetobs_dir=self.hetobs_dir)
        _apply(env, self.env)
        _apply(env, self.rank_env.get(rank))
        return env

    def log_path(self, rank: int, stream: Literal["out", "err"] = "err") -> Path:
        if stream == "out" and self.stdout == "merge":
            stream = "err"
        return self.log_dir / f"{self.log_prefix}rank-{rank}.{stream}"

    def spawn(self, rank: int, env: EnvChanges | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
        """Start rank `rank` (the next one: ranks start in order), with `env` on top of env_of(rank)."""
        if rank != len(self.procs):
            raise ValueError(f"rank {rank} started out of order (next is {len(self.procs)})")
        full = self.env_of(rank)
        _apply(full, env)
        argv = list(self.argv(rank) if callable(self.argv) else self.argv)
        err = open(self.log_path(rank, "err"), "wb")
        out: IO[bytes] | int | None = err
        try:
            if self.stdout == "log":
                out = open(self.log_path(rank, "out"), "wb")
            elif self.stdout == "pipe":
                out = subprocess.PIPE
            p = subprocess.Popen(argv, env=full, cwd=self.cwd, pass_fds=tuple(pass_fds),
                                 stdin=subprocess.PIPE if self.stdin == "pipe" else subprocess.DEVNULL,
                                 stdout=out, stderr=err, start_new_session=True)
        finally:
            # the child holds its own copies of the log files
            err.close()
            if out is not err and hasattr(out, "close"):
                out.close()  # type: ignore[union-attr]
        self.procs.append(p)
        return p

    def start(self) -> "LocalJob":
        """Start every rank not started yet; on any failure, kill those started and re-raise."""
        try:
            for r in range(len(self.procs), self.world):
                self.spawn(r)
        except BaseException:
            self.close()
            raise
        return self

    # -- wait -----------------------------------------------------------------------------
    def wait(self, timeout: float, *, fail_fast: bool = False) -> bool:
        """Wait until every started rank exited (with fail_fast: or one exited non-zero); False
        when `timeout` seconds passed first. Blocks on pidfds: no polling."""
        end = time.monotonic() + timeout
        fds: list[int] = []
        try:
            with selectors.DefaultSelector() as sel:
                for p in self.procs:
                    if p.poll() is None:  # only we reap our children: the pid stays valid until then
                        fd = os.pidfd_open(p.pid)
                        fds.append(fd)
                        sel.register(fd, selectors.EVENT_READ)
                while True:
                    codes = [p.poll() for p in self.procs]
                    if all(c is not None for c in codes) or (fail_fast and any(c not in (None, 0) for c in codes)):
                        return True
                    left = end - time.monotonic()
                    if left <= 0:
                        return False
                    for key, _ in sel.select(left):
                        sel.unregister(key.fd)
        finally:
            for fd in fds:
                os.close(fd)

    # -- stop -----------------------------------------------------------------------------
    def _killpg(self, p: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_rank(self, rank: int) -> float:
        """SIGKILL rank `rank`'s process group and reap it; returns time.monotonic() of the kill."""
        p = self.procs[rank]
        if p.poll() is None:
            self.killed.add(rank)
        self._killpg(p)
        t = time.monotonic()
        p.wait()
        return t

    def kill(self) -> None:
        """SIGKILL every rank's process group and reap every rank (idempotent)."""
        for r, p in enumerate(self.procs):
            if p.poll() is None:
                self.killed.add(r)
                self._killpg(p)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                pass
        # a rank that exited by itself may have left children in its group
        for p in self.procs:
            self._killpg(p)

    def close(self) -> None:
        """kill(), then close the pipes to and from the ranks (idempotent)."""
        self.kill()
        for p in self.procs:
            for f in (p.stdin, p.stdout):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass

    def __enter__(self) -> "LocalJob":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the ranks left ----------------------------------------------------------------
    def tail(self, rank: int, stream: Literal["out", "err"] = "err", lines: int = 12) -> str:
        """The last lines rank `rank` wrote to stderr (or stdout, when it goes to a log)."""
        if stream == "out" and self.stdout == "pipe":
            return ""
        return tail_of(self.log_path(rank, stream), lines)

    def exits(self, lines: int = 12) -> list[RankExit]:
        """Every started rank: its exit status (None while it runs) and the end of its output."""
        return [RankExit(rank=r, pid=p.pid, returncode=p.poll(), killed=r in self.killed,
                         stderr_tail=self.tail(r, "err", lines),
                         stdout_tail=self.tail(r, "out", lines) if self.stdout == "log" else "")
                for r, p in enumerate(self.procs)]
