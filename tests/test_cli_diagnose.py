"""`hetobs diagnose` end to end in-process (typer's CliRunner keeps stdout and stderr apart).

Exit codes 0 healthy / 1 fault / 2 usage / 3 no data; --json is exactly one JSON
document on stdout; --exclude-hosts prints just the hosts; messages go to stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from diagnosis_factory import JobSpec, make_fr_dump, make_fr_entry
from hetobs.cli.main import app

runner = CliRunner()


@pytest.fixture
def hung(tmp_path: Path) -> Path:
    job = JobSpec(4, job="j7")
    job.not_joined(3)
    job.write(tmp_path)
    return tmp_path


def test_fault_human(hung: Path) -> None:
    r = runner.invoke(app, ["diagnose", "--job", "j7", "--dir", str(hung)])
    assert r.exit_code == 1, r.output
    assert "FAULT" in r.stdout and "rank_not_joined" in r.stdout
    assert "rank 3 never called seq 17" in r.stdout  # evidence
    assert "ranks" in r.stdout and "not_joined" in r.stdout  # per-rank table
    assert "exclude hosts: node1" in r.stdout


def test_fault_json(hung: Path) -> None:
    r = runner.invoke(app, ["diagnose", "--job", "j7", "--dir", str(hung), "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["status"] == "fault" and doc["job"] == "j7"
    assert [(v["kind"], v["ranks"]) for v in doc["verdicts"]] == [("rank_not_joined", [3])]
    assert r.stderr == ""


def test_exclude_hosts(hung: Path) -> None:
    r = runner.invoke(app, ["diagnose", "--job", "j7", "--dir", str(hung), "--exclude-hosts"])
    assert r.exit_code == 1 and r.stdout == "node1\n"


def test_hetobs_dir_default(hung: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETOBS_DIR", str(hung))
    r = runner.invoke(app, ["diagnose", "--job", "j7", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["verdicts"][0]["ranks"] == [3]


def test_healthy_exit_0(tmp_path: Path) -> None:
    job = JobSpec(3, job="ok", seconds=0.1)
    for d in job.dumps.values():
        d["reason"] = "on_demand"
    job.write(tmp_path)
    r = runner.invoke(app, ["diagnose", "--job", "ok", "--dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "HEALTHY" in r.stdout


def test_no_data_exit_3(tmp_path: Path) -> None:
    r = runner.invoke(app, ["diagnose", "--job", "missing", "--dir", str(tmp_path), "--json"])
    assert r.exit_code == 3
    assert json.loads(r.stdout)["status"] == "no_data"
    assert f"no usable data: {tmp_path / 'missing'}: job directory does not exist" in r.stderr  # names it


@pytest.mark.parametrize("args", [
    [],
    ["--job", "a", "--fr", "x"],
    ["--job", "a/b"],
    ["--fr", "x", "--incident", "i"],
])
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    r = runner.invoke(app, ["diagnose", *args])
    assert r.exit_code == 2, r.output
    assert r.stdout == ""


def test_unknown_incident_exit_2(hung: Path) -> None:
    r = runner.invoke(app, ["diagnose", "--job", "j7", "--dir", str(hung), "--incident", "nope"])
    assert r.exit_code == 2
    assert "incident 'nope' not found" in r.stderr and r.stdout == ""


def test_fr_input(tmp_path: Path) -> None:
    folder = tmp_path / "fr"
    folder.mkdir()
    for rank in range(3):
        entries = [make_fr_entry(s) for s in range(1, 6 if rank != 1 else 5)]
        (folder / f"nccl_trace_rank_{rank}").write_text(json.dumps(make_fr_dump(3, entries)))
    r = runner.invoke(app, ["diagnose", "--fr", str(folder), "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["source"] == "flight_recorder" and doc["verdicts"][0]["ranks"] == [1]


def test_many_ranks_table_is_summarized(tmp_path: Path) -> None:
    job = JobSpec(100, job="big")
    job.not_joined(42)
    job.write(tmp_path)
    r = runner.invoke(app, ["diagnose", "--job", "big", "--dir", str(tmp_path)])
    assert r.exit_code == 1
    assert "99 other rank(s): in_op in all_reduce seq 17 on comm 0" in r.stdout


def test_console_script_subprocess(hung: Path) -> None:
    """The real entry point: stdout is the JSON document, the exit code is 1."""
    p = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", "j7", "--dir", str(hung), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["verdicts"][0]["kind"] == "rank_not_joined"
