"""Shared fixtures for the multi-process tests (see tests/_launch.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _launch import Job, open_fds, shm_entries  # noqa: E402


def _core_available() -> tuple[bool, str]:
    try:
        import hetobs._core  # noqa: F401
    except Exception as e:  # ImportError, or a broken build
        return False, f"hetobs._core is not importable: {type(e).__name__}: {e}"
    return True, ""


@pytest.fixture(scope="module", autouse=True)
def _dead_ranks_segments_removed() -> Iterator[None]:
    """After each test module, the /dev/shm segments its dead ranks left are removed (`hetobs
    clean`'s rules, limited to entries that appeared meanwhile). Ranks a test kills or lets
    fail keep their stats segment for post-mortem reading, 2 MiB of RAM each: a whole suite
    left ~2,000 of them in tmpfs. Per module, not per test: a module's fixture may kill ranks
    whose segments several of its tests read."""
    from hetobs.clean import clean

    before = set(os.listdir("/dev/shm"))
    yield
    appeared = set(os.listdir("/dev/shm")) - before
    if appeared:
        clean(among=appeared)


@pytest.fixture(scope="session")
def core() -> Any:
    """The native module; tests that launch ranks depend on it. An unbuilt or broken core fails
    them (set HETOBS_TEST_SKIP_WITHOUT_CORE=1 to skip instead while the core is being written)."""
    ok, why = _core_available()
    if not ok:
        if os.environ.get("HETOBS_TEST_SKIP_WITHOUT_CORE"):
            pytest.skip(why)
        pytest.fail(why)
    import hetobs._core

    return hetobs._core


class Launcher:
    """Starts jobs for one test and guarantees they are all dead (SIGKILL per process group)
    when the test ends, passed or failed."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.jobs: list[Job] = []

    def __call__(self, program: str, world_size: int, args: dict[str, Any] | None = None, *,
                 start: bool = True, **kw: Any) -> Job:
        kw.setdefault("workdir", self.workdir)
        job = Job(program, world_size, args, **kw)
        self.jobs.append(job)
        if start:
            job.start()
        return job

    def close(self) -> None:
        for job in self.jobs:
            job.close()


@pytest.fixture
def launcher(core: Any, tmp_path: Path) -> Iterator[Launcher]:
    lau = Launcher(tmp_path)
    try:
        yield lau
    finally:
        lau.close()


class LeakCheck:
    """Open fds of the test process and /dev/shm entries, before vs after.

    After the test: the test process holds no new fds (the launcher closed its pipes and
    logs), and no /dev/shm entry of a job that ended cleanly is left behind. Jobs whose
    ranks the test SIGKILLed may leave the dead rank's segments; those are removed (so
    they do not pile up) and listed in `self.killed_leftovers` rather than failing.
    """

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.fds_before = open_fds()
        self.shm_before = shm_entries()
        self.killed_leftovers: list[str] = []

    def check(self) -> list[str]:
        problems = []
        for job in self.launcher.jobs:
            left = job.shm_leftovers(self.shm_before)
            if not left:
                continue
            if job.killed:
                self.killed_leftovers += left
                for name in left:
                    try:
                        os.unlink(Path("/dev/shm") / name)
                    except OSError:
                        pass
            else:
                problems.append(f"job {job.job_id} (ended without kills) left /dev/shm entries: {left}")
        new_fds = open_fds() - self.fds_before
        # fds the test opened and still uses legitimately would show up here too; resolve them
        leaked = []
        for fd in sorted(new_fds):
            try:
                leaked.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
            except OSError:
                pass
        if leaked:
            problems.append(f"test process leaked fds: {leaked}")
        return problems


@pytest.fixture
def leak_check(launcher: Launcher) -> Iterator[LeakCheck]:
    lc = LeakCheck(launcher)
    yield lc
    launcher.close()
    problems = lc.check()
    if problems:
        pytest.fail("\n".join(problems))

