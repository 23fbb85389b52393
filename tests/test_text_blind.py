"""Text-blind diagnosis (issue 30): real incidents of every fault kind the suite makes, written
by the runtime in dump format 2.1, diagnosed as written and again with every sentence blanked
(tests/_blank.py). The verdicts (kinds, ranks, links, comm, seq) must be the same: the
diagnosis reads a 2.1 dump's fields, never its English.

Each incident is judged post-mortem (every process gone) as from another host, so nothing
but the files decides; the untouched diagnosis must also name the injected culprit, or the
comparison would prove nothing."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from _blank import blank_job, verdict_keys
from hetobs.demo.runner import EXPECTED, run_demo
from hetobs.diagnosis import Options, diagnose

ELSEWHERE = "not-this-host:0"  # judge from the files alone: no /proc of the ranks' host
ROOT_REASON = None if os.geteuid() == 0 and shutil.which("iptables") else "needs root and iptables"


def _judge(job_dir: Path, incident: str | None = None) -> Any:
    return diagnose(Options(job_dir=job_dir, host_key=ELSEWHERE, incident=incident))


def _same_without_text(job_dir: Path, tmp_path: Path, incident: str | None = None) -> Any:
    """Diagnose `job_dir` as written and with its 2.1 text blanked; assert equal verdicts."""
    versions = {json.loads(p.read_text())["version"] for p in job_dir.glob("incidents/*/rank-*.json")}
    assert versions == {"2.1"}, versions
    blind = tmp_path / "blind" / job_dir.name
    blind.parent.mkdir()
    assert blank_job(job_dir, blind) > 0, "the dumps held no text to blank"
    seen, without = _judge(job_dir, incident), _judge(blind, incident)
    assert verdict_keys(without) == verdict_keys(seen), (verdict_keys(seen), verdict_keys(without))
    return seen


# (fault, culprit): world 3, the fault at op 3 (tests/test_diagnosis_faults.py runs them all sizes).
DEMO_CASES = [("kill", 1), ("stop", 2), ("sleep", 0), ("mismatch", 1), ("deadlock", 2), ("link", 1)]


@pytest.mark.slow
@pytest.mark.parametrize("fault,culprit", DEMO_CASES)
def test_demo_faults_are_judged_the_same_without_text(fault: str, culprit: int, tmp_path: Path) -> None:
    if fault == "link" and ROOT_REASON:
        pytest.skip(ROOT_REASON)
    res = run_demo(world=3, fault=fault, culprit=culprit, at=3, ops=8, hang_timeout=1.5, workdir=tmp_path / "jobs")
    report = _same_without_text(res.job_dir, tmp_path)
    top = report.verdicts[0] if report.verdicts else None
    assert top is not None and top.kind.value in {EXPECTED[fault], "rank_dead", "rank_unresponsive"}, \
        verdict_keys(report)
    if fault == "link":
        assert [tuple(x) for x in top.links] == [res.link], verdict_keys(report)
    else:
        assert culprit in top.ranks, verdict_keys(report)


@pytest.mark.slow
def test_timeout_is_judged_the_same_without_text(launcher: Any, leak_check: Any, tmp_path: Path) -> None:
    """Rank 1 of 2 never calls the op; rank 0's own timeout (1 s) fails it: the error dumps'
    cause_info names rank 1, with or without the sentences."""
    job = launcher("timeout", 2, {"per_op": None}, transport="tcp", timeout=1.0, gates=["release-1"], deadline=60.0)
    job.wait_event(0, "raised", timeout=30)
    job_dir = job.hetobs_dir / job.job_id
    incident = None
    end = time.monotonic() + 30
    while incident is None and time.monotonic() < end:  # rank 1 dumps at rank 0's request
        done = [d for d in (job_dir / "incidents").glob("error-*") if len(list(d.glob("rank-*.json"))) >= 2]
        incident = done[0].name if done else None
        if incident is None:
            time.sleep(0.1)  # dumps appear by rename from the rank processes: polled
    assert incident, "no error incident with both dumps"
    job.gate_open("release-1")
    job.wait(timeout=30)
    report = _same_without_text(job_dir, tmp_path, incident)
    assert [(v.kind.value, v.ranks) for v in report.verdicts if v.kind.is_fault] == [("rank_not_joined", [1])]


@pytest.mark.slow
def test_island_stop_is_judged_the_same_without_text(tmp_path: Path) -> None:
    """Islands (gloo in one, hetobs in the other): rank 2 stops between ops while its island peer
    waits for it inside Gloo (tests/test_islands_diagnosis.py's job); the wrapped library's comms
    and the relay's native one dump 2.1 as well."""
    pytest.importorskip("torch")
    from test_islands_diagnosis import stopped_job

    run = tmp_path / "run"
    run.mkdir()
    with stopped_job(run) as job:
        job.kill()
    report = _same_without_text(job.dir / job.job_id, tmp_path)
    faults = [v for v in report.verdicts if v.kind.is_fault]
    assert faults and faults[0].ranks == [2], verdict_keys(report)
