"""Launch benchmark jobs, drive them size by size, turn their timings into nccl-tests rows.

Design:

* One long-lived job per backend ("hetobs-shm", "hetobs-tcp", "gloo", ...): a
  process per rank running `python -m hetobs.bench.worker`, driven over its
  stdin/stdout with one JSON line per command. Start-up cost (torch import,
  rendezvous) is paid once, and an idle job blocks reading stdin, so it takes no
  CPU while another backend is measured.
* Interleaving: for every repetition, for every size, each backend runs one batch
  in turn (the order rotates per repetition, so no backend always comes first
  after a switch). Drift of the machine over the run therefore hits every backend
  alike, and the repetitions of one (backend, size) are spread over the whole run.
* Timing is barrier-free, as in nccl-tests: each rank times a batch of `iters`
  back-to-back ops after `warmup` untimed ones and reports the batch average. A
  (backend, size) time is the max over ranks of each rank's median over
  repetitions.
* Bandwidth follows nccl-tests exactly: `size` is the larger of a rank's input
  and output buffers (the whole gathered/scattered buffer for all_gather,
  reduce_scatter and all_to_all), algbw = size / time, busbw = algbw x
  `bus_factor(op, n)`.

Nothing here prints or exits: failures come back in `BenchResult.failures`, and
progress goes to an optional callback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from ..codes import busbw_factor
from ..ports import free_port
from .mpi_shm import MpiShmDir

__all__ = [
    "BACKENDS", "DEFAULT_SIZES", "DTYPES", "OPS", "QUICK_SIZES", "BenchConfig", "BenchError", "BenchResult",
    "Progress", "Row", "backend_unavailable", "bus_factor", "element_count", "format_size", "measure_memcpy",
    "parse_size", "parse_sizes", "plan_iters", "run_bench",
]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: Collectives the benchmark drives (every one both hetobs and Gloo implement).
OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")

#: Backend name -> (worker backend, HETOBS_TRANSPORT or None).
BACKENDS: dict[str, tuple[str, str | None]] = {
    "hetobs-shm": ("hetobs", "shm"),
    "hetobs-tcp": ("hetobs", "tcp"),
    "hetobs": ("hetobs", "auto"),
    # shared memory with all_reduce's algorithm forced (HETOBS_SMALL_BYTES), to measure the crossover
    "hetobs-shm-direct": ("hetobs", "shm"),
    "hetobs-shm-ring": ("hetobs", "shm"),
    "hetobs-tcp-direct": ("hetobs", "tcp"),
    "hetobs-tcp-ring": ("hetobs", "tcp"),
    # shared memory without the single-copy path (HETOBS_SHM_SINGLE_COPY_BYTES off), to measure its crossover
    "hetobs-shm-2copy": ("hetobs", "shm"),
    "gloo": ("gloo", None),
    # Open MPI through mpi4py, started by mpirun with its default binding (the peer to beat)
    "ompi": ("mpi", None),
    # "hetobs_islands" over the same ranks cut into two islands (first half, second half),
    # Gloo inside each: host tensors straight on the relay's wire; staged through the relay's
    # copies (what device memory takes), pipelined; and staged unpipelined (copy all, send
    # all, copy all).
    "islands": ("islands", "auto"),
    "islands-staged": ("islands", "auto"),
    "islands-unpipelined": ("islands", "auto"),
}
#: Extra environment of the forced-algorithm and island variants.
ISLAND_ENV: dict[str, dict[str, str]] = {
    "hetobs-shm-direct": {"HETOBS_SMALL_BYTES": str(1 << 62)},
    "hetobs-shm-ring": {"HETOBS_SMALL_BYTES": "0"},
    "hetobs-tcp-direct": {"HETOBS_SMALL_BYTES": str(1 << 62)},
    "hetobs-tcp-ring": {"HETOBS_SMALL_BYTES": "0"},
    "hetobs-shm-2copy": {"HETOBS_SHM_SINGLE_COPY_BYTES": str(1 << 62)},
    "islands": {"HETOBS_RELAY_STAGE": "auto"},
    "islands-staged": {"HETOBS_RELAY_STAGE": "host", "HETOBS_RELAY_PIPELINE": "1"},
    "islands-unpipelined": {"HETOBS_RELAY_STAGE": "host", "HETOBS_RELAY_PIPELINE": "0"},
}

#: dtype name -> (item size in bytes, nccl-tests type name).
DTYPES: dict[str, tuple[int, str]] = {
    "float32": (4, "float"),
    "float64": (8, "double"),
    "float16": (2, "half"),
    "int32": (4, "int32"),
    "int64": (8, "int64"),
    "int8": (1, "int8"),
    "uint8": (1, "uint8"),
}

#: 8 B, then powers of 4 from 64 B to 64 MiB.
DEFAULT_SIZES: tuple[int, ...] = (8,) + tuple(4 ** k for k in range(3, 14))
#: A few sizes for a demo: latency, mid, and one >= 16 MiB so the memcpy fraction shows.
QUICK_SIZES: tuple[int, ...] = (8, 64 * KiB, 1 * MiB, 16 * MiB)

_REDUCING = {"all_reduce", "reduce_scatter", "reduce"}
_ROOTED = {"broadcast", "reduce", "gather", "scatter"}
_BLOCKED = {"all_gather", "reduce_scatter", "all_to_all"}  # total count must split evenly over ranks


class BenchError(RuntimeError):
    """A benchmark job could not start, failed, or timed out."""


# -- arithmetic -------------------------------------------------------------------------

def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw factor: busbw = algbw x factor, for `n` ranks (the native recorder's
    rule, hetobs.codes.busbw_factor: 0 at one rank for all_gather as for all_reduce)."""
    if n < 1:
        raise ValueError(f"n={n}: need at least one rank")
    return busbw_factor(op, n)


def element_count(op: str, size: int, n: int, itemsize: int) -> int:
    """Total elements of the benchmarked buffer for a requested size in bytes.

    As nccl-tests: all_gather / reduce_scatter / all_to_all round down to a multiple
    of the rank count (at least one element per rank); others take size // itemsize,
    at least one.
    """
    count = max(1, size // itemsize)
    if op in _BLOCKED:
        count = max(1, count // n) * n
    return count


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'8' -> 8, '4K' -> 4096, '1M' / '1MiB' / '1MB' -> 1048576, '1G' -> 2**30 (binary, as nccl-tests)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"size {text!r}: expected bytes with an optional K, M or G suffix (e.g. 8, 4K, 64M)")
    value = float(m.group(1)) * {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1 << 40}[m.group(2).lower()]
    if value < 1 or value != int(value):
        raise ValueError(f"size {text!r}: must be a whole number of bytes, at least 1")
    return int(value)


def parse_sizes(text: str) -> tuple[int, ...]:
    """Comma-separated sizes ('8,1M,64M'); order kept, duplicates dropped."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ValueError(f"sizes {text!r}: expected a comma-separated list such as 8,1M,64M")
    return tuple(dict.fromkeys(parse_size(p) for p in parts))


def format_size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    if n >= MiB:
        return f"{n / MiB:.1f} MiB"
    if n >= KiB:
        return f"{n / KiB:.1f} KiB"
    return f"{n} B"


def plan_iters(size: int, quick: bool = False) -> tuple[int, int]:
    """(warmup, timed iterations) for one batch: fewer iterations as sizes grow, so a batch
    moves about 256 MiB (32 MiB in quick mode) and the 64 MiB case stays short on 2 cores.
    Up to 2,000 ops per batch: a batch of 100 small ops lasted 0.2-0.5 ms, so one lost time
    slice (the runner, a timer) moved it by 20-50% (16 KiB ratios to Open MPI from 0.41 to
    1.28 between runs of the same build; alone, both sides varied under 5%)."""
    budget, lo, hi = (32 * MiB, 2, 20) if quick else (256 * MiB, 3, 2000)
    iters = max(lo, min(hi, budget // max(1, size)))
    warmup = 1 if quick else max(1, min(10, iters // 5))
    return warmup, iters


def measure_memcpy(nbytes: int = 256 * MiB, repeats: int = 5) -> float:
    """Best-of-`repeats` numpy copy bandwidth of this machine, in GB/s copied (1e9 bytes/s)."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)  # both written: pages faulted before timing
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def backend_unavailable(name: str) -> str | None:
    """Why `name` cannot run here (None when it can). Never imports torch."""
    if name not in BACKENDS:
        return f"unknown backend {name!r} (expected one of {', '.join(BACKENDS)})"
    kind = BACKENDS[name][0]
    if kind == "mpi":
        if shutil.which("mpirun") is None:
            return "mpirun is not on PATH (Debian: apt-get install openmpi-bin)"
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install mpi4py)"
        return None
    if kind in ("gloo", "islands"):
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install 'hetobs[torch]')"
        return None
    try:
        found = importlib.util.find_spec("hetobs._core") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else "the native core hetobs._core is not built (pip install -e .)"


# -- configuration and results ------------------------------------------------------------

@dataclass
class BenchConfig:
    ranks: int = 2
    op: str = "all_reduce"
    backends: tuple[str, ...] = ("hetobs-shm", "hetobs-tcp", "gloo", "ompi")
    sizes: tuple[int, ...] | None = None  # None: DEFAULT_SIZES (QUICK_SIZES with quick)
    reps: int | None = None  # None: 5 (3 with quick)
    dtype: str = "float32"
    quick: bool = False
    timeout_s: float = 120.0  # per batch (the job is stopped and the backend marked failed after it)
    start_timeout_s: float = 180.0  # job start-up (imports + rendezvous)
    memcpy_bytes: int | None = None  # None: 256 MiB (64 MiB with quick); 0 skips the measurement
    check: bool = True  # verify each op's result once per size (untimed)

    def resolved(self) -> "BenchConfig":
        """A copy with defaults filled in and every field validated (ValueError names the field)."""
        if self.op not in OPS:
            raise ValueError(f"op={self.op!r}: expected one of {', '.join(OPS)}")
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise ValueError(f"ranks={self.ranks!r}: expected at least 1")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: expected one of {', '.join(DTYPES)}")
        backends = tuple(dict.fromkeys(self.backends))
        if not backends:
            raise ValueError("backends: expected at least one")
        for b in backends:
            if b not in BACKENDS:
                raise ValueError(f"backend {b!r}: expected one of {', '.join(BACKENDS)}")
        sizes = tuple(self.sizes) if self.sizes is not None else (QUICK_SIZES if self.quick else DEFAULT_SIZES)
        if not sizes or any(int(s) < 1 for s in sizes):
            raise ValueError(f"sizes={sizes!r}: expected positive byte counts")
        reps = self.reps if self.reps is not None else (3 if self.quick else 5)
        if reps < 1:
            raise ValueError(f"reps={reps}: expected at least 1")
        memcpy = self.memcpy_bytes if self.memcpy_bytes is not None else (64 * MiB if self.quick else 256 * MiB)
        if self.timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        return BenchConfig(ranks=self.ranks, op=self.op, backends=backends, sizes=tuple(int(s) for s in sizes),
                           reps=int(reps), dtype=self.dtype, quick=self.quick, timeout_s=float(self.timeout_s),
                           start_timeout_s=float(self.start_timeout_s), memcpy_bytes=int(memcpy), check=self.check)


@dataclass
class Row:
    """One (backend, size) line, in nccl-tests terms. Times in microseconds, bandwidths in GB/s (1e9)."""

    backend: str
    op: str
    ranks: int
    size: int  # bytes
    count: int  # elements
    type: str  # nccl-tests type name ("float")
    redop: str  # "sum", or "none" for ops that do not reduce
    root: int  # -1 for ops without a root
    time_us: float
    algbw: float
    busbw: float
    busbw_vs_gloo: float | None = None  # busbw / Gloo's busbw at this size, same run
    busbw_vs_ompi: float | None = None  # busbw / Open MPI's busbw at this size, same run
    busbw_of_memcpy: float | None = None  # busbw / memcpy GB/s, for sizes >= 16 MiB
    memcpy_gbs: float | None = None
    reps: int = 0  # repetitions measured
    warmup: int = 0
    iters: int = 0  # timed iterations per batch
    rank_time_us: list[float] = field(default_factory=list)  # each rank's median

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Progress:
    done: int
    total: int
    message: str


@dataclass
class BenchResult:
    config: BenchConfig
    rows: list[Row]
    memcpy_gbs: float | None
    failures: dict[str, str] = field(default_factory=dict)  # backend -> error (partial rows may remain)
    skipped: dict[str, str] = field(default_factory=dict)  # backend -> why it was not run
    info: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend -> what its ranks reported
    notes: list[str] = field(default_factory=list)  # things a reader of the numbers should know
    wall_s: float = 0.0

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.rows]


# -- jobs ----------------------------------------------------------------------------------

def _import_root() -> str:
    """Directory holding the `hetobs` package this process imported (for the workers' PYTHONPATH)."""
    import hetobs

    return os.path.dirname(os.path.dirname(os.path.abspath(hetobs.__file__)))


class _Job:
    """One backend's ranks: processes spoken to by JSON lines on stdin/stdout."""

    def __init__(self, name: str, cfg: BenchConfig, workdir: str) -> None:
        self.name = name
        self.cfg = cfg
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[str] = []
        self._bufs: list[bytes] = []
        self.ready: list[dict[str, Any]] = []

    # start-up
    def start(self) -> None:
        kind, transport = BACKENDS[self.name]
        n = self.cfg.ranks
        port = free_port()
        base = dict(os.environ)
        root = _import_root()
        base["PYTHONPATH"] = os.pathsep.join(p for p in (base.get("PYTHONPATH", ""), root) if p)
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                    HETOBS_JOB_ID=f"bench-{self.name}-{uuid.uuid4().hex[:8]}")
        base.setdefault("HETOBS_DIR", os.path.join(self.workdir, "hetobs"))
        # ops (and Gloo's rendezvous) may wait on peers at least as long as the runner waits for a batch
        op_timeout = max(self.cfg.timeout_s, self.cfg.start_timeout_s)
        base.setdefault("HETOBS_TIMEOUT", str(op_timeout))
        base.setdefault("OMP_NUM_THREADS", "1")
        if kind in ("gloo", "islands"):
            base.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if transport is not None:
            base["HETOBS_TRANSPORT"] = transport
        base.update(ISLAND_ENV.get(self.name, {}))
        cmd = [sys.executable, "-m", "hetobs.bench.worker", "--backend", kind, "--op", self.cfg.op,
               "--dtype", self.cfg.dtype, "--timeout", str(op_timeout)]
        for r in range(n):
            env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
            if kind == "islands":  # two islands: ranks [0, n/2) and [n/2, n), Gloo inside
                env.update(HETOBS_ISLAND="ab"[r * 2 // n] if n > 1 else "a", HETOBS_ISLAND_BACKEND="gloo")
            log = os.path.join(self.workdir, f"{self.name}-rank{r}.log")
            self.logs.append(log)
            with open(log, "wb") as err:
                self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                   stderr=err, env=env))
            self._bufs.append(b"")
        self.ready = self.receive(self.cfg.start_timeout_s, "start-up")

    # protocol
    def request(self, msg: dict[str, Any], timeout: float, what: str) -> list[dict[str, Any]]:
        line = (json.dumps(msg) + "\n").encode()
        for r in range(self.cfg.ranks):
            try:
                w = self._writer(r)
                w.write(line)
                w.flush()
            except (BrokenPipeError, OSError):
                raise BenchError(self._died(r, what)) from None
        return self.receive(timeout, what)

    def _writer(self, r: int) -> Any:
        """Where rank r reads its commands from."""
        stdin = self.procs[r].stdin
        assert stdin is not None
        return stdin

    def _reader(self, r: int) -> Any:
        """Where rank r writes its replies (something with a file descriptor)."""
        stdout = self.procs[r].stdout
        assert stdout is not None
        return stdout

    def receive(self, timeout: float, what: str) -> list[dict[str, Any]]:
        """One JSON reply from every rank, in rank order."""
        replies: list[dict[str, Any] | None] = [None] * self.cfg.ranks
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        try:
            for r in range(self.cfg.ranks):
                if not self._take_line(r, replies):
                    sel.register(self._reader(r), selectors.EVENT_READ, r)
            while any(x is None for x in replies):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r, x in enumerate(replies) if x is None]
                    raise BenchError(f"{self.name}: no reply to {what} from rank(s) {missing} within {timeout:g} s"
                                     + self._tails(missing))
                for key, _ in sel.select(min(left, 1.0)):
                    r = key.data
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        raise BenchError(self._died(r, what))
                    self._bufs[r] += chunk
                    if self._take_line(r, replies):
                        sel.unregister(key.fileobj)
        finally:
            sel.close()
        out = [x for x in replies if x is not None]
        for r, x in enumerate(out):
            if "error" in x:
                raise BenchError(f"{self.name}: rank {r} failed in {what}: {x['error']}" + self._tails([r]))
        return out

    def _take_line(self, r: int, replies: list[dict[str, Any] | None]) -> bool:
        buf = self._bufs[r]
        if b"\n" not in buf:
            return False
        line, self._bufs[r] = buf.split(b"\n", 1)
        try:
            replies[r] = json.loads(line)
        except ValueError:
            replies[r] = {"error": f"unreadable reply {line[:200]!r}"}
        return True

    # diagnostics
    def _died(self, r: int, what: str) -> str:
        p = self.procs[r]
        try:
            code = p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = f"exited with code {code}" if code is not None else "closed its output"
        return f"{self.name}: rank {r} {how} during {what}" + self._tails([r])

    def _tails(self, ranks: Sequence[int], lines: int = 12) -> str:
        parts = []
        for r in ranks:
            try:
                with open(self.logs[r], "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - 8192))
                    text = f.read().decode(errors="replace").strip().splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append(f"\n--- {self.name} rank {r} stderr (last lines) ---\n" + "\n".join(text))
        return "".join(parts)

    # shutdown
    def close(self, graceful: bool = True) -> list[dict[str, Any]]:
        byes: list[dict[str, Any]] = []
        if graceful and all(p.poll() is None for p in self.procs):
            try:
                byes = self.request({"cmd": "exit"}, 30.0, "shutdown")
            except BenchError:
                byes = []
        for p in self.procs:
            try:
                p.wait(timeout=10 if graceful else 0.1)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for f in (p.stdin, p.stdout):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass
        return byes


class _MpiJob(_Job):
    """Open MPI's ranks under one `mpirun` (default binding: no --bind-to), each speaking the
    worker protocol over a TCP connection to this process (mpirun gives ranks no stdin of
    their own and merges their stdout)."""

    def __init__(self, name: str, cfg: BenchConfig, workdir: str) -> None:
        super().__init__(name, cfg, workdir)
        self._socks: list[socket.socket] = []
        self._files: list[Any] = []
        self._shm = MpiShmDir()

    def start(self) -> None:
        n = self.cfg.ranks
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(n)
            host, port = listener.getsockname()
            env = {k: v for k, v in os.environ.items()
                   if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LD_PRELOAD")}
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), _import_root()) if p)
            env.setdefault("OMP_NUM_THREADS", "1")
            op_timeout = max(self.cfg.timeout_s, self.cfg.start_timeout_s)
            cmd = [shutil.which("mpirun") or "mpirun", "-np", str(n)]
            if os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
            if n > (os.cpu_count() or 1):
                cmd.append("--oversubscribe")
            cmd += self._shm.mca_args()
            cmd += [sys.executable, "-m", "hetobs.bench.worker", "--backend", "mpi", "--op", self.cfg.op,
                    "--dtype", self.cfg.dtype, "--timeout", str(op_timeout), "--control", f"{host}:{port}"]
            log = os.path.join(self.workdir, f"{self.name}-mpirun.log")
            self.logs = [log] * n
            with open(log, "wb") as out:
                # its own session: closing kills mpirun and every rank it started in one signal
                self.procs = [subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True)]
            self._accept(listener, n)
        finally:
            listener.close()
        self.ready = self.receive(self.cfg.start_timeout_s, "start-up")
        # connections arrive in any order: put them in rank order by what each rank said first
        order = sorted(range(n), key=lambda i: int(self.ready[i]["rank"]))
        if [int(self.ready[i]["rank"]) for i in order] != list(range(n)):
            raise BenchError(f"{self.name}: ranks reported {[x['rank'] for x in self.ready]}, expected 0..{n - 1}")
        self._socks = [self._socks[i] for i in order]
        self._files = [self._files[i] for i in order]
        self.ready = [self.ready[i] for i in order]

    def _accept(self, listener: socket.socket, n: int) -> None:
        deadline = time.monotonic() + self.cfg.start_timeout_s
        listener.settimeout(0.5)
        while len(self._socks) < n:
            if self.procs[0].poll() is not None:
                raise BenchError(self._died(0, "start-up"))
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: {len(self._socks)} of {n} ranks connected within "
                                 f"{self.cfg.start_timeout_s:g} s" + self._tails([0]))
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            conn.setblocking(True)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks.append(conn)
            self._files.append(conn.makefile("wb"))
            self._bufs.append(b"")

    def _writer(self, r: int) -> Any:
        return self._files[r]

    def _reader(self, r: int) -> Any:
        return self._socks[r]

    def _died(self, r: int, what: str) -> str:
        try:
            code = self.procs[0].wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = f"(mpirun exited with code {code})" if code is not None else "closed its connection"
        return f"{self.name}: rank {r} {how} during {what}" + self._tails([r])

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

    def _tails(self, ranks: Sequence[int], lines: int = 12) -> str:
        return super()._tails(list(ranks)[:1], lines)  # one log: mpirun's, every rank's output merged

    def close(self, graceful: bool = True) -> list[dict[str, Any]]:
        byes: list[dict[str, Any]] = []
        mpirun = self.procs[0] if self.procs else None
        if graceful and mpirun is not None and mpirun.poll() is None and len(self._socks) == self.cfg.ranks:
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


# -- the run -------------------------------------------------------------------------------

def run_bench(config: BenchConfig, progress: Callable[[Progress], None] | None = None) -> BenchResult:
    """Run the benchmark described by `config` and return its rows (never prints or exits).

    Backends that cannot run here are listed in `skipped`; ones that fail while running
    in `failures` (their job is stopped, the other backends go on).
    """
    cfg = config.resolved()
    assert cfg.reps is not None and cfg.sizes is not None and cfg.memcpy_bytes is not None
    t_start = time.monotonic()
    n = cfg.ranks
    itemsize, type_name = DTYPES[cfg.dtype]

    def tell(done: int, total: int, message: str) -> None:
        if progress is not None:
            progress(Progress(done, total, message))

    skipped = {b: why for b in cfg.backends if (why := backend_unavailable(b)) is not None}
    failures: dict[str, str] = {}
    info: dict[str, dict[str, Any]] = {}

    # sizes as they will really run, duplicates (after rounding) dropped
    plan: list[tuple[int, int, int, int]] = []  # (bytes, count, warmup, iters)
    seen: set[int] = set()
    for s in cfg.sizes:
        count = element_count(cfg.op, s, n, itemsize)
        if count in seen:
            continue
        seen.add(count)
        plan.append((count * itemsize, count, *plan_iters(count * itemsize, cfg.quick)))

    memcpy_gbs = None
    if cfg.memcpy_bytes > 0:
        tell(0, 0, f"measuring memcpy bandwidth ({format_size(cfg.memcpy_bytes)} copy)")
        memcpy_gbs = measure_memcpy(cfg.memcpy_bytes)

    workdir = tempfile.mkdtemp(prefix="hetobs-bench-")
    jobs: dict[str, _Job] = {}
    # samples[backend][size index][rank] -> batch-average seconds, one per repetition
    samples: dict[str, list[list[list[float]]]] = {}
    try:
        for b in cfg.backends:
            if b in skipped:
                continue
            tell(0, 0, f"starting {b} ({n} ranks)")
            job = (_MpiJob if BACKENDS[b][0] == "mpi" else _Job)(b, cfg, workdir)
            jobs[b] = job
            try:
                job.start()
            except BenchError as e:
                failures[b] = str(e)
                job.close(graceful=False)
                continue
            info[b] = {"ready": job.ready}
            samples[b] = [[[] for _ in range(n)] for _ in plan]

        live = [b for b in cfg.backends if b in samples]
        total = cfg.reps * len(plan) * len(live)
        done = 0
        for rep in range(cfg.reps):
            order = live[rep % len(live):] + live[:rep % len(live)] if live else []
            for i, (nbytes, count, warmup, iters) in enumerate(plan):
                for b in order:
                    if b in failures:
                        continue
                    tell(done, total, f"rep {rep + 1}/{cfg.reps}  {format_size(nbytes):>9}  {b}")
                    msg = {"cmd": "run", "count": count, "warmup": warmup, "iters": iters,
                           "check": cfg.check and rep == 0}
                    try:
                        replies = jobs[b].request(msg, cfg.timeout_s, f"{cfg.op} of {nbytes} bytes")
                    except BenchError as e:
                        failures[b] = str(e)
                        jobs[b].close(graceful=False)
                    else:
                        for r, reply in enumerate(replies):
                            samples[b][i][r].append(float(reply["seconds"]))
                    done += 1
        tell(total, total, "done")
    finally:
        for b, job in jobs.items():
            if b not in failures:
                byes = job.close()
                if byes and b in info:
                    info[b]["exit"] = byes
        shutil.rmtree(workdir, ignore_errors=True)

    rows = _rows(cfg, plan, samples, memcpy_gbs, type_name)
    notes = []
    for b, i in info.items():
        want = BACKENDS[b][1]
        if want in ("shm", "tcp"):
            used = sorted({t for bye in i.get("exit", []) for t in bye.get("link_transports", [])})
            if used and used != [want]:
                notes.append(f"{b}: ranks reported links over {', '.join(used)}, not only {want}")
    return BenchResult(config=cfg, rows=rows, memcpy_gbs=memcpy_gbs, failures=failures, skipped=skipped,
                       info=info, notes=notes, wall_s=time.monotonic() - t_start)


def _rows(cfg: BenchConfig, plan: list[tuple[int, int, int, int]], samples: dict[str, list[list[list[float]]]],
          memcpy_gbs: float | None, type_name: str) -> list[Row]:
    n = cfg.ranks
    factor = bus_factor(cfg.op, n)
    rows: list[Row] = []
    for b in cfg.backends:
        if b not in samples:
            continue
        for i, (nbytes, count, warmup, iters) in enumerate(plan):
            per_rank = samples[b][i]
            if not per_rank or any(not s for s in per_rank):
                continue  # this size never completed on every rank (backend failed first)
            medians = [statistics.median(s) for s in per_rank]
            t = max(medians)
            algbw = nbytes / t / 1e9 if t > 0 else 0.0
            rows.append(Row(
                backend=b, op=cfg.op, ranks=n, size=nbytes, count=count, type=type_name,
                redop="sum" if cfg.op in _REDUCING else "none", root=0 if cfg.op in _ROOTED else -1,
                time_us=t * 1e6, algbw=algbw, busbw=algbw * factor, memcpy_gbs=memcpy_gbs,
                reps=min(len(s) for s in per_rank), warmup=warmup, iters=iters,
                rank_time_us=[m * 1e6 for m in medians],
            ))
    gloo = {r.size: r for r in rows if r.backend == "gloo"}
    ompi = {r.size: r for r in rows if r.backend == "ompi"}
    for r in rows:
        g = gloo.get(r.size)
        if r.backend != "gloo" and g is not None and g.busbw > 0:
            r.busbw_vs_gloo = r.busbw / g.busbw
        m = ompi.get(r.size)
        if r.backend != "ompi" and m is not None and m.busbw > 0:
            r.busbw_vs_ompi = r.busbw / m.busbw
        if memcpy_gbs and r.size >= 16 * MiB:
            r.busbw_of_memcpy = r.busbw / memcpy_gbs
    return rows
