"""Open MPI as a benchmark peer: its ranks under one `mpirun`, speaking the worker protocol.

mpirun gives ranks no stdin of their own and merges their stdout, so each rank connects
back to this process over TCP (`--control host:port`) and speaks the protocol there. The
ranks are mpirun's children, not ours: hetobs.launch_local does not start them; mpirun runs
in a session of its own so one killpg ends it and the ranks it started, and a rank that
left that group is killed through the pid it reported.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Any, Sequence

from ..launch_local import tail_of
from ..line_reader import LineReader
from .mpi_shm import MpiShmDir
from .workers import BenchError, WorkerJob, python_path

__all__ = ["MpiWorkers"]


class MpiWorkers(WorkerJob):
    """Open MPI's ranks under one `mpirun`: its default binding, or (bind "core") none of its own,
    each rank binding itself as the other backends' ranks do (worker.py)."""

    def __init__(self, name: str, ranks: int, *, op: str, dtype: str, op_timeout: float, workdir: str,
                 bind: str = "none") -> None:
        super().__init__(name, ranks)
        self.op, self.dtype, self.op_timeout, self.bind = op, dtype, op_timeout, bind
        self.log = os.path.join(workdir, f"{name}-mpirun.log")
        self.mpirun: subprocess.Popen[bytes] | None = None
        self._socks: list[socket.socket] = []
        self._files: list[Any] = []
        self._shm = MpiShmDir()

    def start(self, timeout: float) -> None:
        n = self.ranks
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(n)
            host, port = listener.getsockname()
            env = {k: v for k, v in os.environ.items()
                   if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LD_PRELOAD")}
            env["PYTHONPATH"] = python_path()
            env.setdefault("OMP_NUM_THREADS", "1")
            cmd = [shutil.which("mpirun") or "mpirun", "-np", str(n)]
            if os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
            if n > (os.cpu_count() or 1):
                cmd.append("--oversubscribe")
            if self.bind != "none":
                cmd += ["--bind-to", "none"]
            cmd += self._shm.mca_args()
            cmd += [sys.executable, "-m", "hetobs.bench.worker", "--backend", "mpi", "--op", self.op,
                    "--dtype", self.dtype, "--timeout", str(self.op_timeout), "--control", f"{host}:{port}",
                    "--bind", self.bind]
            with open(self.log, "wb") as out:
                # its own session: closing kills mpirun and every rank it started in one signal
                self.mpirun = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True)
            self._accept(listener, n, timeout)
        finally:
            listener.close()
        self._lines = LineReader([s.fileno() for s in self._socks])
        self.ready = self.receive(timeout, "start-up")
        # connections arrive in any order: put them in rank order by what each rank said first
        order = sorted(range(n), key=lambda i: int(self.ready[i]["rank"]))
        if [int(self.ready[i]["rank"]) for i in order] != list(range(n)):
            raise BenchError(f"{self.name}: ranks reported {[x['rank'] for x in self.ready]}, expected 0..{n - 1}")
        self._socks = [self._socks[i] for i in order]
        self._files = [self._files[i] for i in order]
        self.ready = [self.ready[i] for i in order]
        # nothing is buffered past the ready lines: a rank says nothing more until asked
        self._lines = LineReader([s.fileno() for s in self._socks])

    def _accept(self, listener: socket.socket, n: int, timeout: float) -> None:
        assert self.mpirun is not None
        deadline = time.monotonic() + timeout
        listener.settimeout(0.5)
        while len(self._socks) < n:
            if self.mpirun.poll() is not None:
                raise BenchError(self._died(0, "start-up"))
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: {len(self._socks)} of {n} ranks connected within "
                                 f"{timeout:g} s" + self._tails([0]))
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue  # a short accept timeout, to notice mpirun's exit
            conn.setblocking(True)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks.append(conn)
            self._files.append(conn.makefile("wb"))

    def _writer(self, r: int) -> IO[bytes]:
        return self._files[r]

    def _died(self, r: int, what: str) -> str:
        code = None
        if self.mpirun is not None:
            try:
                code = self.mpirun.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        how = f"(mpirun exited with code {code})" if code is not None else "closed its connection"
        return f"{self.name}: rank {r} {how} during {what}" + self._tails([r])

    def _tails(self, ranks: Sequence[int], lines: int = 12) -> str:
        # one log, mpirun's: every rank's output merged
        return self._tail_text(list(ranks)[0], tail_of(self.log, lines)) if ranks else ""

    def _kill_ranks(self, timeout: float = 10.0) -> None:
        """SIGKILL every rank that said it was ready (one that left mpirun's process group
        survives killpg) and wait until each has exited: they are not our children, so a
        pidfd tells when."""
        fds = []
        for ready in self.ready:
            try:
                pid = int(ready["pid"])
                fd = os.pidfd_open(pid)
            except (ProcessLookupError, KeyError, ValueError, OSError):
                continue  # gone already
            fds.append(fd)
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            deadline = time.monotonic() + timeout
            with selectors.DefaultSelector() as sel:
                for fd in fds:
                    sel.register(fd, selectors.EVENT_READ)
                while sel.get_map() and time.monotonic() < deadline:
                    for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                        sel.unregister(key.fd)
        finally:
            for fd in fds:
                os.close(fd)

    def close(self, graceful: bool = True) -> list[dict[str, Any]]:
        byes: list[dict[str, Any]] = []
        mpirun = self.mpirun
        if graceful and mpirun is not None and mpirun.poll() is None and len(self._socks) == self.ranks:
            try:
                byes = self.request({"cmd": "exit"}, 30.0, "shutdown")
            except BenchError:
                byes = []
        if mpirun is not None:
            try:
                mpirun.wait(timeout=10 if graceful else 0.1)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(mpirun.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                mpirun.wait()
                self._kill_ranks()
        for f in (*self._files, *self._socks):
            try:
                f.close()
            except OSError:
                pass
        self._shm.remove()
        return byes
