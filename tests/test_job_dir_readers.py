"""Every CLI reader of a job directory refuses another user's and never follows a link inside it (issue 13).

`hetobs diagnose` refused a job directory owned by someone else (tests/test_local_users.py);
`dump`, `top`, `trace`, `plan`, `jobs` and the exporter read one without looking whose it
was, and some opened its files with a plain open(), following a planted link. Here a hand-
made job directory (the files are untrusted input anyway, so no job needs to run) is made
another uid's (root chowns) or mode 0777, and each command runs as a real subprocess: one
line naming the path, exit code 3 (README, "Exit codes"). Then rank, dump and plan files
that are symbolic links to readable files outside the job are refused, not read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hetobs.exporters.source import ShmSource
from hetobs.plan.report import read_batches

STRANGER = 12345
INCIDENT = "ondemand-1-abcd"
RANK = {"schema": "hetobs.rank", "version": "2.0", "rank": 0, "world_size": 1, "host": "elsewhere", "pid": 1,
        "start_time_ns": 1, "exited_cleanly": True}
DUMP = {"schema": "hetobs.dump", "version": "2.0", "rank": 0, "host": "elsewhere", "time_ns": 2_000_000_000,
        "reason": "on_demand", "entries": []}
PLAN = {"schema": "hetobs.plan.batch", "rank": 0, "batch": 8}


def _job_dir(root: Path) -> tuple[str, Path]:
    job = f"jd{uuid.uuid4().hex[:10]}"
    d = root / job
    for sub, doc in (("ranks", RANK), (f"incidents/{INCIDENT}", DUMP), ("plan", PLAN)):
        (d / sub).mkdir(parents=True, mode=0o700)
        (d / sub / "rank-0.json").write_text(json.dumps(doc))
    d.chmod(0o700)
    return job, d


def _hetobs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HETOBS_TRACEBACK": "0"}, stdin=subprocess.DEVNULL)


def _commands(root: Path, job: str, out: Path) -> dict[str, list[str]]:
    common = ["--job", job, "--dir", str(root)]
    return {
        "dump": ["dump", *common, "--timeout", "1"],
        "top": ["top", *common, "--once", "--interval", "0.05"],
        "trace": ["trace", *common, "-o", str(out)],
        "plan": ["plan", *common, "--global-batch", "8", "--from", "dumps"],
        "exporter": ["exporter", *common, "--textfile", str(out.with_suffix(".prom"))],
    }


def _foreign(kind: str, d: Path) -> str:
    if kind == "owner":
        if os.geteuid() != 0:
            pytest.skip("chown to another uid needs root")
        os.chown(d, STRANGER, STRANGER)
        return f"owned by uid {STRANGER}"
    d.chmod(0o777)
    return "writable by group or others (mode 0777)"


@pytest.mark.parametrize("kind", ["owner", "mode"])
@pytest.mark.parametrize("command", ["dump", "top", "trace", "plan", "exporter"])
def test_a_job_dir_of_another_user_is_refused(tmp_path: Path, command: str, kind: str) -> None:
    job, d = _job_dir(tmp_path)
    why = _foreign(kind, d)
    out = tmp_path / "trace.json"
    run = _hetobs(*_commands(tmp_path, job, out)[command])
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, run.stderr  # one line, no traceback
    assert str(d) in lines[0] and why in lines[0] and "--trust-dir" in lines[0], lines[0]
    assert not out.exists() and not out.with_suffix(".prom").exists()


def test_trust_dir_reads_it_anyway(tmp_path: Path) -> None:
    job, d = _job_dir(tmp_path)
    _foreign("mode", d)
    out = tmp_path / "trace.json"
    run = _hetobs(*_commands(tmp_path, job, out)["trace"], "--trust-dir")
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["traceEvents"], "the dump's instant event at least"


@pytest.mark.parametrize("kind", ["owner", "mode"])
def test_jobs_lists_a_job_dir_of_another_user_as_refused_without_reading_it(tmp_path: Path, kind: str) -> None:
    job, d = _job_dir(tmp_path)
    mine, _ = _job_dir(tmp_path)
    why = _foreign(kind, d)
    run = _hetobs("jobs", "--dir", str(tmp_path), "--json")
    assert run.returncode == 0, run.stderr
    listed = {j["job"]: j for j in json.loads(run.stdout)["jobs"]}
    assert listed[mine]["state"] == "exited" and listed[mine]["refused"] is None
    assert listed[job]["state"] == "refused" and listed[job]["ranks"] == 0 and listed[job]["hosts"] == []
    assert str(d) in listed[job]["refused"] and why in listed[job]["refused"]
    assert str(d) in run.stderr and why in run.stderr


def _link_outside(tmp_path: Path, d: Path, rel: str, doc: dict[str, object]) -> None:
    outside = tmp_path / f"outside-{uuid.uuid4().hex[:6]}.json"
    outside.write_text(json.dumps(doc))
    (d / rel).unlink()
    (d / rel).symlink_to(outside)


def test_a_linked_rank_file_is_refused_by_dump_jobs_and_the_stats_source(tmp_path: Path) -> None:
    job, d = _job_dir(tmp_path)
    _link_outside(tmp_path, d, "ranks/rank-0.json", RANK)
    run = _hetobs("dump", "--job", job, "--dir", str(tmp_path), "--json", "--timeout", "1")
    assert run.returncode == 3, run.stderr
    assert "symbolic link" in json.loads(run.stdout)["skipped"]["0"]  # not "exited cleanly": it was not read
    run = _hetobs("jobs", "--dir", str(tmp_path), "--json")
    listed = {j["job"]: j for j in json.loads(run.stdout)["jobs"]}
    assert "symbolic link" in listed[job]["problems"]["0"], listed[job]
    # `hetobs top` and the exporter: a vanished rank is "exited cleanly" only by a file that is no link
    assert ShmSource(job, job_dir=str(d))._exited_cleanly(0) is False
    (d / "ranks/rank-0.json").unlink()
    (d / "ranks/rank-0.json").write_text(json.dumps(RANK))
    assert ShmSource(job, job_dir=str(d))._exited_cleanly(0) is True


def test_a_linked_dump_is_refused_by_trace(tmp_path: Path) -> None:
    job, d = _job_dir(tmp_path)
    _link_outside(tmp_path, d, f"incidents/{INCIDENT}/rank-0.json", DUMP)
    out = tmp_path / "trace.json"
    run = _hetobs("trace", "--job", job, "--dir", str(tmp_path), "--incident", INCIDENT, "-o", str(out))
    assert run.returncode == 3, run.stderr
    assert "symbolic link" in run.stderr and "rank-0.json" in run.stderr, run.stderr
    assert not out.exists()


def test_a_linked_plan_report_is_refused(tmp_path: Path) -> None:
    _job, d = _job_dir(tmp_path)
    assert read_batches(str(d))[0] == {0: {"batch": 8, "island": None}}
    _link_outside(tmp_path, d, "plan/rank-0.json", PLAN)
    reports, problems = read_batches(str(d))
    assert reports == {}
    assert len(problems) == 1 and "symbolic link" in problems[0] and "rank-0.json" in problems[0], problems
