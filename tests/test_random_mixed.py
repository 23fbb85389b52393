"""A few thousand randomized mixed ops on 4 ranks: every result checked, nothing leaks.

All ranks draw the same random sequence from a shared seed: op (all_reduce, reduce_scatter,
all_gather, broadcast, reduce, all_to_all, barrier, send/recv), communicator (the world or
a parity split), dtype, size (0 .. 100k elements, log-uniform), reduction, root, and
whether the op is async (waited up to 3 ops later). Inside each rank, the count of open
fds and of this job's /dev/shm entries must not grow over the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Launcher, LeakCheck

pytestmark = pytest.mark.slow

OPS = 4000


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_random_mixed(launcher: Launcher, leak_check: LeakCheck, transport: str) -> None:
    job = launcher("random_mixed", 4, {"seed": 20240 + len(transport), "ops": OPS, "max_n": 100_000},
                   transport=transport, deadline=400.0)
    res = job.wait()
    res.check()
    problems = []
    for r in res.ranks:
        sec = r.result["sections"]["random"]
        if sec["error"]:
            problems.append(f"rank {r.rank}: raised {sec['error']['type']}: {sec['error']['msg']}\n"
                            f"{sec['error'].get('traceback', '')}")
        problems += [f"rank {r.rank}: {f}" for f in sec["failures"]]
        assert sec["checks"] > OPS // 2, f"rank {r.rank} made only {sec['checks']} checks"
    assert not problems, "\n".join(problems)
    counts = dict(res.ranks[0].result["counts"])
    assert counts.pop("short_lived_groups", 0) == OPS // 500
    assert sum(counts.values()) == OPS
    assert all(counts.get(k, 0) > 20 for k in ("all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                "reduce", "all_to_all", "barrier", "send_recv")), counts
