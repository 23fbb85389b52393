"""The backends `hetobs bench` compares, whether each can run here, and the job that runs one.

Every backend but Open MPI runs `python -m hetobs.bench.worker` once per rank on
hetobs.launch_local; they differ in the worker's --backend and their environment (the
transport, an algorithm forced, two islands). Open MPI's ranks run under mpirun
(mpi_job.py).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import TYPE_CHECKING

from ..config import setting
from ..launch_local import new_job_id
from .mpi_job import MpiWorkers
from .workers import LocalWorkers, WorkerJob

if TYPE_CHECKING:
    from .config import BenchConfig

__all__ = ["BACKENDS", "ISLAND_ENV", "backend_job", "backend_unavailable"]

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



def _default(name: str, value: str) -> str:
    """The caller's own setting of `name` when it has one, else `value`."""
    return os.environ.get(name, value)


def backend_job(name: str, cfg: "BenchConfig", workdir: str) -> WorkerJob:
    """The (not yet started) job of backend `name`: `cfg.ranks` workers for `cfg.op` and `cfg.dtype`."""
    kind, transport = BACKENDS[name]
    n = cfg.ranks
    # ops (and Gloo's rendezvous) may wait on peers at least as long as the runner waits for a batch
    op_timeout = max(cfg.timeout_s, cfg.start_timeout_s)
    if kind == "mpi":
        return MpiWorkers(name, n, op=cfg.op, dtype=cfg.dtype, op_timeout=op_timeout, workdir=workdir,
                          bind=cfg.bind)
    env: dict[str, str | None] = {"HETOBS_TIMEOUT": _default("HETOBS_TIMEOUT", str(op_timeout)),
                                  "OMP_NUM_THREADS": _default("OMP_NUM_THREADS", "1")}
    if kind in ("gloo", "islands"):
        env["GLOO_SOCKET_IFNAME"] = _default("GLOO_SOCKET_IFNAME", "lo")
    if transport is not None:
        env["HETOBS_TRANSPORT"] = transport
    env.update(ISLAND_ENV.get(name, {}))
    rank_env: dict[int, dict[str, str | None]] = {}
    if kind == "islands":  # two islands: ranks [0, n/2) and [n/2, n), Gloo inside
        rank_env = {r: {"HETOBS_ISLAND": "ab"[r * 2 // n] if n > 1 else "a", "HETOBS_ISLAND_BACKEND": "gloo"}
                    for r in range(n)}
    argv = [sys.executable, "-m", "hetobs.bench.worker", "--backend", kind, "--op", cfg.op, "--dtype", cfg.dtype,
            "--timeout", str(op_timeout), "--bind", cfg.bind]
    return LocalWorkers(name, argv, n, log_dir=workdir,
                        hetobs_dir=setting("HETOBS_DIR") or os.path.join(workdir, "hetobs"),
                        job_id=new_job_id(f"bench-{name}-"), env=env, rank_env=rank_env)
