"""Who arrives last (csrc/include/hetobs/record/arrival.h), in live jobs of real processes.

A rank whose compute is slower is named by the exporter's `hetobs_last_arrivals_total`
within 50 steps, over shared memory and over TCP, with no dump and no --window; in a
healthy job no rank is last more than twice its share of the time; every rank of an op
heard the same last rank; and the word's fold itself (combine) is checked through
the records it produces.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _telemetry_job import RankJob, metric_by_rank  # noqa: E402

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).resolve().parent / "arrival_programs.py"


def _run(tmp_path: Path, world: int, args: dict[str, Any], transport: str) -> tuple[dict[int, float], dict[int, float],
                                                                                    list[dict[str, Any]]]:
    with RankJob("steps", world, args, workdir=tmp_path, env={"HETOBS_TRANSPORT": transport},
                 programs=PROGRAMS) as job:
        done = sorted(job.wait_all("done", timeout=120), key=lambda e: e["rank"])
        last, judged = (metric_by_rank(job.job_id, "hetobs_last_arrivals"),
                        metric_by_rank(job.job_id, "hetobs_arrivals_judged"))
        job.send("exit")
        for p in job.procs:
            assert p.wait(timeout=60) == 0
    return last, judged, done


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_slower_rank_is_named_by_the_metric_within_50_steps(tmp_path: Path, transport: str) -> None:
    world, slow, steps = 3, 1, 50
    last, judged, done = _run(tmp_path, world, {"steps": steps, "compute_ms": 20, "slow_rank": slow,
                                                "slow_factor": 1.2, "elements": 4096}, transport)
    # Every judged op counts on exactly one rank: the counts add up to the ops, on every rank.
    assert all(judged[r] >= steps for r in range(world)), judged
    assert sum(last.values()) == judged[0] == judged[1] == judged[2], (last, judged)
    # The slow rank (4 ms behind each step) is last nearly every time.
    assert max(last, key=lambda r: last[r]) == slow and last[slow] >= 0.9 * steps, last
    # Every rank heard the same last rank for each op, and a lag near the 4 ms it came behind.
    assert done[0]["last"] == done[1]["last"] == done[2]["last"]
    assert len(done[0]["last"]) == steps
    lags = sorted(done[slow]["lag_ns"][1:])
    assert 2e6 < lags[len(lags) // 2] < 40e6, lags
    # The slow rank is the one behind the first; the others are near it.
    assert sorted(done[slow]["behind_ns"][1:])[steps // 2] > 2e6


def test_healthy_job_counts_stay_even(tmp_path: Path) -> None:
    """Three statistically alike ranks (each step's compute varies by up to 1 ms, drawn per rank):
    nobody is last more than twice their share. Without that variation the ranks' order is
    set by the scheduler (three ranks on two cores: the one left waiting for a core after each op
    enters the next one last, a real straggler of the machine's making), not by the job."""
    world, steps = 3, 500
    last, judged, done = _run(tmp_path, world, {"steps": steps, "compute_ms": 0.5, "jitter_ms": 1.0, "elements": 256},
                              "shm")
    total = sum(last.values())
    assert total == judged[0] and total >= steps, (last, judged)
    # No rank above twice its share (the bar), and each rank last some of the time.
    assert all(last.get(r, 0) <= 2 * total / world for r in range(world)), last
    assert all(last.get(r, 0) > 0 for r in range(world)), last
    assert done[0]["last"] == done[1]["last"] == done[2]["last"]
