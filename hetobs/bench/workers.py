"""Long-lived benchmark jobs driven by JSON lines: one command line in, one reply line out per rank.

`hetobs bench` and `hetobs bench overhead` start one job per backend (or variant) and pay
its start-up (torch import, rendezvous) once; an idle job blocks reading its commands, so
it takes no CPU while another is measured. `WorkerJob` is the protocol, whatever carries
it; `LocalWorkers` carries it over each rank's stdin and stdout, with the ranks started by
hetobs.launch_local (Open MPI's ranks, under mpirun, are in mpi_job.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import IO, Any, Mapping, Optional, Sequence

from ..launch_local import LocalJob
from ..line_reader import LineEnd, LineReader, LineTimeout

__all__ = ["BenchError", "LocalWorkers", "WorkerJob", "import_root", "python_path"]


class BenchError(RuntimeError):
    """A benchmark job could not start, failed, or timed out."""


def import_root() -> str:
    """Directory holding the `hetobs` package this process imported (for the workers' PYTHONPATH)."""
    import hetobs

    return os.path.dirname(os.path.dirname(os.path.abspath(hetobs.__file__)))


def python_path() -> str:
    """PYTHONPATH for workers: the caller's, then the hetobs this process runs (a source tree
    that is not installed included)."""
    return os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), import_root()) if p)


class WorkerJob:
    """One job's ranks speaking the worker protocol. Subclasses start them, say where each rank
    reads commands (`_writer`) and how a dead rank is described (`_died`, `_tails`)."""

    def __init__(self, name: str, ranks: int) -> None:
        self.name = name
        self.ranks = ranks
        self.ready: list[dict[str, Any]] = []
        self._lines: LineReader | None = None

    def start(self, timeout: float) -> None:
        """Start the ranks; `ready` holds each rank's first reply (within `timeout` seconds)."""
        raise NotImplementedError

    def close(self, graceful: bool = True) -> list[dict[str, Any]]:
        """Stop the ranks (graceful: ask them to exit first); what they said when asked."""
        raise NotImplementedError

    def _writer(self, r: int) -> IO[bytes]:
        raise NotImplementedError

    def _died(self, r: int, what: str) -> str:
        raise NotImplementedError

    def _tails(self, ranks: Sequence[int], lines: int = 12) -> str:
        raise NotImplementedError

    def request(self, msg: dict[str, Any], timeout: float, what: str) -> list[dict[str, Any]]:
        """Send `msg` to every rank; their replies, in rank order."""
        line = (json.dumps(msg) + "\n").encode()
        for r in range(self.ranks):
            try:
                w = self._writer(r)
                w.write(line)
                w.flush()
            except (BrokenPipeError, OSError):
                raise BenchError(self._died(r, what)) from None
        return self.receive(timeout, what)

    def receive(self, timeout: float, what: str) -> list[dict[str, Any]]:
        """One JSON reply from every rank, in rank order (a reply with "error" fails the job)."""
        assert self._lines is not None, "the job was not started"
        try:
            got = self._lines.read(range(self.ranks), timeout)
        except LineTimeout as e:
            raise BenchError(f"{self.name}: no reply to {what} from rank(s) {e.missing} within {timeout:g} s"
                             + self._tails(e.missing)) from None
        except LineEnd as e:
            raise BenchError(self._died(e.source, what)) from None
        out = []
        for r in range(self.ranks):
            try:
                out.append(dict(json.loads(got[r])))
            except ValueError:
                out.append({"error": f"unreadable reply {got[r][:200]!r}"})
        for r, x in enumerate(out):
            if "error" in x:
                raise BenchError(f"{self.name}: rank {r} failed in {what}: {x['error']}" + self._tails([r]))
        return out

    def _tail_text(self, r: int, text: str) -> str:
        return f"\n--- {self.name} rank {r} stderr (last lines) ---\n{text}" if text else ""


class LocalWorkers(WorkerJob):
    """Worker ranks on this host: `argv` once per rank, commands on stdin, replies on stdout,
    stderr in `log_dir` as `<name>-rank-R.err`."""

    def __init__(self, name: str, argv: Sequence[str], ranks: int, *, log_dir: str | Path, hetobs_dir: str | Path,
                 job_id: str, env: Mapping[str, Optional[str]] | None = None,
                 rank_env: Mapping[int, Mapping[str, Optional[str]]] | None = None) -> None:
        super().__init__(name, ranks)
        self.local = LocalJob(argv, ranks, log_dir=log_dir, hetobs_dir=hetobs_dir, job_id=job_id,
                              env={"PYTHONPATH": python_path(), **(env or {})}, rank_env=rank_env,
                              stdin="pipe", stdout="pipe", log_prefix=f"{name}-")

    def start(self, timeout: float) -> None:
        """Start the ranks and wait for every rank's first line (what it says once ready)."""
        self.local.start()
        self._lines = LineReader([p.stdout.fileno() for p in self.local.procs if p.stdout is not None])
        self.ready = self.receive(timeout, "start-up")

    def _writer(self, r: int) -> IO[bytes]:
        stdin = self.local.procs[r].stdin
        assert stdin is not None
        return stdin

    def _died(self, r: int, what: str) -> str:
        try:
            code: int | None = self.local.procs[r].wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = f"exited with code {code}" if code is not None else "closed its output"
        return f"{self.name}: rank {r} {how} during {what}" + self._tails([r])

    def _tails(self, ranks: Sequence[int], lines: int = 12) -> str:
        return "".join(self._tail_text(r, self.local.tail(r, "err", lines)) for r in ranks)

    def close(self, graceful: bool = True) -> list[dict[str, Any]]:
        """Ask every rank to exit (graceful, and all still run) and return what they said; then
        kill whatever still runs."""
        byes: list[dict[str, Any]] = []
        if graceful and self._lines is not None and all(p.poll() is None for p in self.local.procs):
            try:
                byes = self.request({"cmd": "exit"}, 30.0, "shutdown")
            except BenchError:
                byes = []
            self.local.wait(10)
        self.local.close()
        return byes
