"""The pipelined relay against its unpipelined baseline and against each stage alone.

`run_relay_bench(RelayBenchConfig(...))` starts one 2-rank job (hetobs.bench.relay_worker)
that runs every variant in interleaved rounds (see the worker's docstring), then turns
the timings into rows: a (variant, size) time is the max over ranks of each rank's median
over repetitions; busbw = bytes moved per direction / time; ratio = pipelined /
unpipelined busbw; efficiency = pipelined busbw / the slowest stage's busbw; cores = CPU
seconds of both ranks (every thread) per op / its time: how much of the machine a variant
keeps busy.

Two settings: host staging (memcpy copy threads: every stage is CPU work on the same
cores), or a device (`device="standin"`: the stand-in accelerator, its copy engines paced
at `copy_gbps`, which move bytes without keeping a core busy, as DMA does). With
`wire_gbps` (root) the two ranks run in two network namespaces joined by a veth pair
limited to that rate with tc tbf, over TCP: the wire paced too, so all three stages can
be balanced.

Nothing here prints or exits; `hetobs bench relay` (cli/bench.py) renders it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence
from ..ports import free_port

__all__ = ["RELAY_SIZES", "RELAY_VARIANTS", "DEVICE_VARIANTS", "RelayBenchConfig", "RelayBenchResult", "RelayRow", "run_relay_bench"]

MiB = 1 << 20
RELAY_SIZES: tuple[int, ...] = (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
RELAY_VARIANTS: tuple[str, ...] = ("pipelined", "unpipelined", "wire", "copy")  # host staging
DEVICE_VARIANTS: tuple[str, ...] = ("pipelined", "unpipelined", "d2h", "wire", "h2d")


@dataclass(frozen=True)
class RelayBenchConfig:
    sizes: Sequence[int] = RELAY_SIZES
    reps: int = 3
    chunk_bytes: int = 4 * MiB
    slots: int = 16
    transport: str = "shm"
    timeout_s: float = 600.0
    device: str | None = None      # "standin": the stand-in accelerator's tensors, stage "device"
    copy_gbps: float = 0.0         # with a device: its copy engines' pace (0: unpaced)
    wire_gbps: float | None = None  # root: a veth pair limited to this rate, TCP

    @property
    def variants(self) -> tuple[str, ...]:
        return DEVICE_VARIANTS if self.device else RELAY_VARIANTS


@dataclass
class RelayRow:
    size: int
    pipelined: float    # busbw, GB/s
    unpipelined: float
    stages: dict[str, float]  # each stage alone (copy and wire; or d2h, wire and h2d), GB/s
    ratio: float        # pipelined / unpipelined
    efficiency: float   # pipelined / the slowest stage
    bottleneck: str     # which stage is the slowest
    cores: dict[str, float] = field(default_factory=dict)  # variant -> cores kept busy (CPU s / wall s, both ranks)


@dataclass
class RelayBenchResult:
    config: RelayBenchConfig
    rows: list[RelayRow] = field(default_factory=list)
    failure: str | None = None

    def to_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.rows]


def _plan(size: int) -> tuple[int, int]:
    """(warmup, iters): about 64 MiB of traffic per batch, at least 2 timed ops."""
    return 1, max(2, min(20, (64 * MiB) // max(size, 1)))


def run_relay_bench(cfg: RelayBenchConfig) -> RelayBenchResult:
    result = RelayBenchResult(cfg)
    sizes = sorted(set(int(s) for s in cfg.sizes))
    wcfg = {"sizes": sizes, "reps": cfg.reps, "chunk_bytes": cfg.chunk_bytes, "slots": cfg.slots,
            "variants": list(cfg.variants), "plan": {str(s): _plan(s) for s in sizes}, "device": cfg.device,
            "copy_gbps": cfg.copy_gbps}
    link = None
    if cfg.wire_gbps is not None:
        from .netns import NetnsError, PacedLink

        try:
            link = PacedLink(cfg.wire_gbps)
        except NetnsError as e:
            result.failure = f"the paced wire could not be set up: {e}"
            return result
    try:
        outputs = _run_ranks(cfg, wcfg, link, result)
    finally:
        if link is not None:
            link.close()
    if result.failure is not None:
        return result
    for size in sizes:
        bw, cores = {}, {}
        for v in cfg.variants:
            t = max(statistics.median(o["samples"][v][str(size)]) for o in outputs)
            bw[v] = size / t / 1e9
            cores[v] = sum(statistics.median(o["cpu"][v][str(size)]) for o in outputs) / t
        stages = {v: bw[v] for v in cfg.variants if v not in ("pipelined", "unpipelined")}
        slowest = min(stages, key=lambda v: stages[v])
        result.rows.append(RelayRow(size=size, pipelined=bw["pipelined"], unpipelined=bw["unpipelined"],
                                    stages=stages, ratio=bw["pipelined"] / bw["unpipelined"],
                                    efficiency=bw["pipelined"] / stages[slowest], bottleneck=slowest, cores=cores))
    return result


def _run_ranks(cfg: RelayBenchConfig, wcfg: dict[str, Any], link: Any, result: RelayBenchResult) -> list[dict]:
    """Both ranks to the end; their outputs (result.failure set when one failed)."""
    with tempfile.TemporaryDirectory(prefix="hetobs-relay-bench-") as tmp:
        os.chmod(tmp, 0o700)
        port, job = free_port(), f"relaybench-{uuid.uuid4().hex[:8]}"
        procs, logs = [], []
        master = link.ADDRS[0] if link else "127.0.0.1"
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR=master, MASTER_PORT=str(port),
                       HETOBS_JOB_ID=job, HETOBS_DIR=os.path.join(tmp, "dir"),
                       HETOBS_TRANSPORT="tcp" if link else cfg.transport,
                       HETOBS_TIMEOUT=str(cfg.timeout_s), OMP_NUM_THREADS="1")
            log = open(os.path.join(tmp, f"rank-{r}.err"), "w+")
            logs.append(log)
            argv = [sys.executable, "-m", "hetobs.bench.relay_worker", json.dumps(wcfg),
                    os.path.join(tmp, f"rank-{r}.json")]
            procs.append(subprocess.Popen((link.prefix(r) if link else []) + argv, env=env, stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + cfg.timeout_s
        try:
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            result.failure = f"the relay benchmark took longer than {cfg.timeout_s:.0f} s"
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outputs = []
        for r, (p, log) in enumerate(zip(procs, logs)):
            log.seek(0)
            tail = log.read()[-2000:]
            log.close()
            path = os.path.join(tmp, f"rank-{r}.json")
            if result.failure is None and (p.returncode != 0 or not os.path.exists(path)):
                result.failure = f"rank {r} exited with status {p.returncode}: {tail.strip()}"
            if os.path.exists(path):
                with open(path) as f:
                    outputs.append(json.load(f))
    return outputs
