"""One rank of a benchmark job: `python -m hetobs.bench.worker --backend hetobs|gloo|islands|mpi --op OP`.

Started by hetobs.bench.backends (on hetobs.launch_local) with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT (and HETOBS_TRANSPORT for the hetobs backend) set. It speaks one JSON object per line:
commands on stdin, replies on the stdout it was started with (stray output of
libraries is sent to stderr instead, so it cannot corrupt the protocol).
The mpi backend (Open MPI through mpi4py) is started by `mpirun`, which gives ranks
no stdin of their own and merges their stdout: with `--control HOST:PORT` a rank
speaks the same protocol over a TCP connection to the runner instead.

    start-up                          -> {"rank", "ready": true, "backend", ...}
    {"cmd": "run", "count", "warmup", "iters", "check"}
                                      -> {"rank", "count", "seconds"}  (batch average)
    {"cmd": "exit"}                   -> {"rank", "bye": true, ...}
    any failure                       -> {"rank", "error": "..."} and exit code 1

Timing is barrier-free as in nccl-tests: `warmup` untimed ops, then `iters` ops
back to back, timed as one batch on this rank. With "check", one extra untimed op
on a known pattern is verified first.

torch is imported only for the gloo and islands backends, mpi4py only for mpi.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from typing import Any, Callable, Iterable, TextIO

import numpy as np

from ..config import setting
from .config import BINDINGS


def _block(count: int, n: int) -> int:
    if count % n:
        raise ValueError(f"count {count} does not split over {n} ranks")
    return count // n


class _Bench:
    """Buffers (numpy views) for one count, and the op on them."""

    def __init__(self, op: str, rank: int, size: int, dtype: str) -> None:
        self.op, self.rank, self.size, self.dtype = op, rank, size, dtype
        self.count = -1
        self._x: Any = None  # the backend's buffers (numpy arrays or torch tensors) ...
        self._out: Any = None
        self.x: np.ndarray = np.empty(0)  # ... and numpy views of them
        self.out: np.ndarray | None = None
        self.call: Callable[[], object] = lambda: None

    # backends override
    def empty(self, count: int) -> Any:
        raise NotImplementedError

    def view(self, buf: Any) -> np.ndarray:
        raise NotImplementedError

    def make_call(self) -> Callable[[], object]:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass

    # shared
    def prepare(self, count: int) -> None:
        if count == self.count:
            return
        self.count = -1
        self._x = self._out = None  # release the previous size first
        op, n = self.op, self.size
        if op in ("all_gather", "reduce_scatter", "all_to_all"):
            _block(count, n)  # equal blocks, or a clear error
        in_count = count // n if op == "all_gather" else count
        out_count = {"all_gather": count, "reduce_scatter": count // n, "all_to_all": count}.get(op)
        self._x = self.empty(in_count)
        self.x = self.view(self._x)
        self.x[...] = 0
        if out_count is not None:
            self._out = self.empty(out_count)
            self.out = self.view(self._out)
            self.out[...] = 0
        else:
            self.out = None
        self.call = self.make_call()
        self.count = count

    def check(self) -> None:
        """One op on a known pattern, verified; buffers are zeroed afterwards."""
        op, r, n, x, out = self.op, self.rank, self.size, self.x, self.out
        if op == "all_to_all":
            x.reshape(n, -1)[...] = (r * n + np.arange(n, dtype=np.int64)).reshape(n, 1).astype(x.dtype)
        else:
            x[...] = r + 1
        self.call()
        total = n * (n + 1) // 2
        if op == "all_reduce":
            ok, want = bool(np.all(x == total)), f"{total} everywhere"
        elif op == "broadcast":
            ok, want = bool(np.all(x == 1)), "1 (root 0's value) everywhere"
        elif op == "reduce_scatter":
            assert out is not None
            ok, want = bool(np.all(out == total)), f"{total} everywhere"
        elif op == "all_gather":
            assert out is not None
            expect = np.repeat(np.arange(1, n + 1), out.size // n).astype(out.dtype)
            ok, want = bool(np.array_equal(out, expect)), "block i == i + 1"
        elif op == "all_to_all":
            assert out is not None
            expect = np.repeat(np.arange(n) * n + r, out.size // n).astype(out.dtype)
            ok, want = bool(np.array_equal(out, expect)), f"block i == i * {n} + {r}"
        else:
            raise ValueError(f"op {op!r}")
        got = out if out is not None else x
        x[...] = 0
        if out is not None:
            out[...] = 0
        if not ok:
            sample = got[: min(8, got.size)].tolist()
            raise AssertionError(f"{op} of {self.count} elements gave a wrong result on rank {r}: "
                                 f"expected {want}, got {sample}...")

    def run(self, count: int, warmup: int, iters: int, check: bool) -> tuple[float, float]:
        """Seconds of wall time and of this process's CPU time (every thread: the backend's
        own progress threads count) per op, averaged over one batch of `iters` ops."""
        self.prepare(count)
        call = self.call
        if check:
            self.check()
        for _ in range(warmup):
            call()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(iters):
            call()
        t1, c1 = time.perf_counter(), time.process_time()
        return (t1 - t0) / iters, (c1 - c0) / iters


class _Hetobs(_Bench):
    def __init__(self, op: str, dtype: str, timeout: float) -> None:
        import hetobs

        self.comm = hetobs.init()
        self.timeout = timeout
        super().__init__(op, self.comm.rank, self.comm.size, dtype)

    def empty(self, count: int) -> np.ndarray:
        return np.empty(count, dtype=self.dtype)

    def view(self, buf: np.ndarray) -> np.ndarray:
        return buf

    def make_call(self) -> Callable[[], object]:
        c, x, out = self.comm, self.x, self.out
        if self.op == "all_reduce":
            return lambda: c.all_reduce(x)
        if self.op == "broadcast":
            return lambda: c.broadcast(x, 0)
        if self.op == "all_gather":
            return lambda: c.all_gather(out, x)
        if self.op == "reduce_scatter":
            return lambda: c.reduce_scatter(out, x)
        if self.op == "all_to_all":
            return lambda: c.all_to_all(out, x)
        raise ValueError(f"op {self.op!r}")

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"transport_setting": setting("HETOBS_TRANSPORT")}
        try:  # which algorithm each size ran with (the records the recorder kept)
            algos: dict[str, list[str]] = {}
            for rec in self.comm.records():
                seen = algos.setdefault(str(rec.get("bytes")), [])
                if rec.get("algorithm") not in seen:
                    seen.append(str(rec.get("algorithm")))
            out["algorithms_by_bytes"] = algos
        except Exception as e:  # introspection is best effort
            out["records_error"] = repr(e)
        try:
            links = self.comm.links()
            out["link_transports"] = sorted({str(link.get("transport")) for link in links if isinstance(link, dict)})
        except Exception as e:  # introspection is best effort
            out["links_error"] = repr(e)
        return out

    def close(self) -> None:
        self.comm.close()


class _Gloo(_Bench):
    torch_backend = "gloo"

    def __init__(self, op: str, dtype: str, timeout: float) -> None:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        if self.torch_backend != "gloo":
            import hetobs  # noqa: F401 - registers the hetobs backends with torch.distributed
        self.torch, self.dist = torch, dist
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ["MASTER_PORT"]
        dist.init_process_group(self.torch_backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=size, timeout=timedelta(seconds=timeout))
        super().__init__(op, rank, size, dtype)

    def empty(self, count: int) -> Any:
        return self.torch.empty(count, dtype=getattr(self.torch, self.dtype))

    def view(self, buf: Any) -> np.ndarray:
        return buf.numpy()  # shares memory with the tensor

    def make_call(self) -> Callable[[], object]:
        d, x, out = self.dist, self._x, self._out
        if self.op == "all_reduce":
            return lambda: d.all_reduce(x)
        if self.op == "broadcast":
            return lambda: d.broadcast(x, 0)
        if self.op == "all_gather":
            return lambda: d.all_gather_into_tensor(out, x)
        if self.op == "reduce_scatter":
            return lambda: d.reduce_scatter_tensor(out, x)
        if self.op == "all_to_all":
            return lambda: d.all_to_all_single(out, x)
        raise ValueError(f"op {self.op!r}")

    def info(self) -> dict[str, Any]:
        return {"torch": self.torch.__version__, "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


class _Mpi(_Bench):
    """Open MPI through mpi4py (started by mpirun): numpy buffers, the buffer-protocol calls."""

    def __init__(self, op: str, dtype: str, timeout: float) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.world = MPI.COMM_WORLD
        super().__init__(op, self.world.Get_rank(), self.world.Get_size(), dtype)

    def empty(self, count: int) -> np.ndarray:
        return np.empty(count, dtype=self.dtype)

    def view(self, buf: np.ndarray) -> np.ndarray:
        return buf

    def make_call(self) -> Callable[[], object]:
        w, x, out, in_place = self.world, self.x, self.out, self.mpi.IN_PLACE
        if self.op == "all_reduce":
            return lambda: w.Allreduce(in_place, x)
        if self.op == "broadcast":
            return lambda: w.Bcast(x, 0)
        if self.op == "all_gather":
            return lambda: w.Allgather(x, out)
        if self.op == "reduce_scatter":
            return lambda: w.Reduce_scatter_block(x, out)
        if self.op == "all_to_all":
            return lambda: w.Alltoall(x, out)
        raise ValueError(f"op {self.op!r}")

    def info(self) -> dict[str, Any]:
        return {"mpi": self.mpi.Get_library_version().strip().splitlines()[0]}


def _control_stream(address: str) -> tuple[TextIO, TextIO]:
    """(commands, replies) over a TCP connection to the runner at HOST:PORT."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock.makefile("r"), sock.makefile("w", buffering=1)


def _bind_to_core(rank: int) -> None:
    """Run on one CPU: the (rank mod k)-th of the k this process may use, as mpirun's --bind-to
    core places ranks (wrapping round when ranks outnumber CPUs)."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[max(rank, 0) % len(cpus)]})


def _protocol_stream() -> TextIO:
    """The stdout we were started with, kept for replies; fd 1 then points at stderr."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return proto


class _Islands(_Gloo):
    """The same torch calls on "hetobs_islands" (HETOBS_ISLAND / _BACKEND set by the runner)."""

    torch_backend = "hetobs_islands"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetobs.bench.worker", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("hetobs", "gloo", "islands", "mpi"), required=True)
    p.add_argument("--op", default="all_reduce",
                   choices=("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--control", default=None, help="HOST:PORT of the runner, instead of stdin/stdout")
    p.add_argument("--bind", choices=BINDINGS, default="none",
                   help="core: run on the (rank mod CPUs)-th CPU this process may use")
    args = p.parse_args(argv)

    if args.control:
        commands, proto = _control_stream(args.control)
        os.dup2(2, 1)  # stray library output must not reach mpirun's merged stdout as protocol
    else:
        commands, proto = sys.stdin, _protocol_stream()
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
    if args.bind == "core":  # before the backend starts its threads: they inherit the mask
        _bind_to_core(rank)

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps({"rank": rank, **obj}) + "\n")
        proto.flush()

    bench: _Bench | None = None

    def start() -> tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[], dict[str, Any]]]:
        nonlocal bench, rank
        bench = {"hetobs": _Hetobs, "gloo": _Gloo, "islands": _Islands, "mpi": _Mpi}[args.backend](
            args.op, args.dtype, args.timeout)
        rank = bench.rank
        reply({"ready": True, "backend": args.backend, "size": bench.size, "pid": os.getpid(),
               "cpus": sorted(os.sched_getaffinity(0))})

        def run(msg: dict[str, Any]) -> dict[str, Any]:
            assert bench is not None
            secs, cpu = bench.run(int(msg["count"]), int(msg["warmup"]), int(msg["iters"]), bool(msg.get("check")))
            return {"count": int(msg["count"]), "seconds": secs, "cpu_seconds": cpu}

        def bye() -> dict[str, Any]:
            nonlocal bench
            assert bench is not None
            info = bench.info()
            bench.close()
            bench = None
            return info

        return run, bye

    try:
        return serve(commands, reply, start)
    finally:
        if bench is not None:
            try:
                bench.close()
            except Exception:
                pass


def serve(commands: Iterable[str], reply: Callable[[dict[str, Any]], None],
          start: Callable[[], tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[], dict[str, Any]]]]) -> int:
    """A benchmark rank's protocol: `start()` sets the rank up (and replies ready) and gives the
    handlers of "run" (a reply) and "exit" (what the bye carries); any failure, at start-up or
    later, is replied as {"error"} and returns 1 (the runner then stops the peers)."""
    try:
        run, bye = start()
        for line in commands:
            if not line.strip():
                continue
            msg = json.loads(line)
            if msg.get("cmd") == "run":
                reply(run(msg))
            elif msg.get("cmd") == "exit":
                reply({"bye": True, **bye()})
                return 0
            else:
                raise ValueError(f"unknown command {msg!r}")
        return 0  # stdin closed: the runner went away
    except BaseException as e:  # report, then exit non-zero; peers are stopped by the runner
        traceback.print_exc(file=sys.stderr)
        try:
            reply({"error": f"{type(e).__name__}: {e}"})
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
