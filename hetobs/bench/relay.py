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
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..launch_local import LocalJob, new_job_id

__all__ = ["RELAY_SIZES", "RELAY_VARIANTS", "DEVICE_VARIANTS", "RelayBenchConfig", "RelayBenchResult", "RelayRow",
           "run_relay_bench"]

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
    sizes = sorted({int(s) for s in cfg.sizes})
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
        out = [os.path.join(tmp, f"rank-{r}.json") for r in range(2)]

        def argv(r: int) -> list[str]:
            cmd = [sys.executable, "-m", "hetobs.bench.relay_worker", json.dumps(wcfg), out[r]]
            return (link.prefix(r) if link else []) + cmd

        job = LocalJob(argv, 2, log_dir=tmp, hetobs_dir=os.path.join(tmp, "dir"), job_id=new_job_id("relaybench-"),
                       master_addr=link.ADDRS[0] if link else "127.0.0.1", stdout="merge",
                       env={"HETOBS_TRANSPORT": "tcp" if link else cfg.transport, "HETOBS_TIMEOUT": str(cfg.timeout_s),
                            "OMP_NUM_THREADS": "1"})
        with job:
            if not job.wait(cfg.timeout_s):
                result.failure = f"the relay benchmark took longer than {cfg.timeout_s:.0f} s"
        outputs = []
        for x in job.exits(lines=30):
            if result.failure is None and (x.returncode != 0 or not os.path.exists(out[x.rank])):
                result.failure = f"rank {x.rank} exited with status {x.returncode}: {x.stderr_tail}"
            if os.path.exists(out[x.rank]):
                with open(out[x.rank]) as f:
                    outputs.append(json.load(f))
    return outputs
