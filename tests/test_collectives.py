"""Every collective x every dtype against a numpy reference, over real processes and sockets.

One job per (world size, transport) runs every op, dtype, size (0, 1, 7, 1001, 65540 and
~3 MiB), root and reduction, plus sub-communicators, async ops and torch tensors, in
sections (tests/rank_programs.py: prog_collectives). Each section is reported here as
its own test, so a failure names the op; the job itself is launched once per config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from _launch import Job, JobResult, shm_entries

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Config:
    world: int
    transport: str
    torch: bool = False
    env: tuple[tuple[str, str], ...] = ()
    sections: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        extra = "".join(f"-{k.removeprefix('HETOBS_').lower()}={v}" for k, v in self.env)
        return f"w{self.world}-{self.transport}{'-torch' if self.torch else ''}{extra}"


CONFIGS = [
    Config(1, "tcp", sections=("identity", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
                               "all_to_all", "barrier", "split", "new_group", "async")),
    Config(2, "tcp"),
    Config(2, "shm"),
    Config(3, "tcp", torch=True),
    Config(3, "shm", torch=True),
    Config(4, "tcp"),
    Config(4, "shm"),
    # every all_reduce on the ring path, even 1 element over 4 ranks (empty ring blocks)
    Config(4, "tcp", env=(("HETOBS_SMALL_BYTES", "0"),), sections=("all_reduce", "reduce_scatter", "split")),
    Config(3, "shm", env=(("HETOBS_SMALL_BYTES", "0"),), sections=("all_reduce", "reduce_scatter", "large")),
]

SECTIONS = ["identity", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
            "barrier", "send_recv", "large", "split", "new_group", "async", "torch", "final"]


def _wanted(cfg: Config, section: str) -> bool:
    if section == "torch":
        return cfg.torch
    if section == "final":
        return True
    return not cfg.sections or section in cfg.sections


PAIRS = [pytest.param(cfg, sec, id=f"{cfg.id}-{sec}") for cfg in CONFIGS for sec in SECTIONS if _wanted(cfg, sec)]


@dataclass
class Run:
    config: Config
    job: Job
    result: JobResult
    shm_left: list[str] = field(default_factory=list)


def _launch(cfg: Config, workdir: Path) -> Run:
    shm0 = shm_entries()
    job = Job("collectives", cfg.world, {"seed": 1234 + cfg.world, "torch": cfg.torch,
                                         "sections": list(cfg.sections)},
              workdir=workdir, transport=cfg.transport, env=dict(cfg.env), deadline=240.0, gates=["async-hold"])
    try:
        job.start()
        res = job.wait()
    finally:
        job.close()
    return Run(cfg, job, res, job.shm_leftovers(shm0))


@pytest.fixture(scope="module")
def runs(core: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Config], Run]]:
    """One launch per config for the whole module, however pytest orders the tests."""
    cache: dict[Config, Run] = {}

    def get(cfg: Config) -> Run:
        if cfg not in cache:
            cache[cfg] = _launch(cfg, tmp_path_factory.mktemp(cfg.id))
        return cache[cfg]

    yield get
    cache.clear()


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.id for c in CONFIGS])
def test_job_exits_cleanly(runs: Callable[[Config], Run], cfg: Config) -> None:
    """Every rank exits 0 after close(), within the deadline, and leaves no /dev/shm entry."""
    run = runs(cfg)
    run.result.check()
    for r in run.result.ranks:
        assert r.result is not None and r.result.get("close_error") is None, run.result.describe()
    assert not run.shm_left, f"/dev/shm entries left by a cleanly finished job: {run.shm_left}"


@pytest.mark.parametrize("cfg,section", PAIRS)
def test_section(runs: Callable[[Config], Run], cfg: Config, section: str) -> None:
    run = runs(cfg)
    problems = []
    total_checks = 0
    for r in run.result.ranks:
        if r.result is None or "sections" not in r.result:
            pytest.fail(f"rank {r.rank} left no section results\n{run.result.describe()}")
        sec = r.result["sections"].get(section)
        if sec is None:
            problems.append(f"rank {r.rank}: section not run")
            continue
        if sec["skipped"]:
            problems.append(f"rank {r.rank}: {sec['skipped']}")
        if sec["error"]:
            e = sec["error"]
            problems.append(f"rank {r.rank}: raised {e['type']}: {e['msg']}\n{e.get('traceback', '')}")
        for f in sec["failures"]:
            problems.append(f"rank {r.rank}: {f}")
        total_checks += sec["checks"]
    assert not problems, f"{section} on {run.config.id}:\n" + "\n".join(problems)
    # a section that silently checked nothing must not pass (send_recv has no pairs on 1 rank)
    if not (section == "send_recv" and run.config.world == 1):
        assert total_checks > 0, f"{section} on {run.config.id} made no checks"
