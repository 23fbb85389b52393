"""Files in a job or Flight Recorder directory are untrusted, and an unusable one blames nobody.

Synthetic job directories (tests/diagnosis_factory.py) bent the way a broken disk, a
scheduler's kill or a hostile user bends them: dumps that are there but unusable, a
heartbeat later than the incident, dumps that are symbolic links (to a readable file
outside the job) or FIFOs (which would block a reader forever), linked directories.
The FIFO cases run the real `hetobs diagnose` in a subprocess with a deadline, so a
reader that blocks fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from diagnosis_factory import JobSpec, T0, fake_proc, local_key, make_fr_dump, make_fr_entry
from hetobs.diagnosis import Options, Status, diagnose

DIAGNOSE_DEADLINE_S = 60


def _blamed(rep) -> set[int]:  # type: ignore[no-untyped-def]
    return {r for v in rep.verdicts if v.kind.is_fault for r in v.ranks}


def _problems(rep) -> dict[str, str]:  # type: ignore[no-untyped-def]
    out: dict[str, str] = {}
    for p in rep.data_problems:
        out[p.path] = (out[p.path] + "; " if p.path in out else "") + p.problem
    return out


def _gone_job(tmp_path: Path, world: int = 5) -> tuple[JobSpec, Path]:
    """A job on "this" host (fake /proc) whose processes are all gone, as after a scheduler's kill."""
    proc = fake_proc(tmp_path / "proc", {})
    job = JobSpec(world, host_key=local_key(proc))
    return job, proc


def test_unusable_dumps_are_alive_not_dead(tmp_path: Path) -> None:
    job, proc = _gone_job(tmp_path)
    job.not_joined(3)
    job.dumps[4]["version"] = "3.0"  # a future schema
    job_dir = job.write(tmp_path)
    inc = job_dir / "incidents" / job.incident
    text = (inc / "rank-0.json").read_text()
    (inc / "rank-0.json").write_text(text[: len(text) // 2])  # truncated
    (inc / "rank-1.json").write_bytes(os.urandom(4096))  # replaced by random bytes
    rep = diagnose(Options(job_dir=job_dir, proc_root=proc))
    assert rep.status == Status.FAULT
    assert _blamed(rep) == {3}, [(v.kind.value, v.ranks, v.summary) for v in rep.verdicts]
    assert [v.kind.value for v in rep.verdicts if v.kind.is_fault] == ["rank_not_joined"]
    probs = _problems(rep)
    for r in (0, 1, 4):
        assert str(inc / f"rank-{r}.json") in probs, probs
    assert not any("no dump from rank" in p for p in probs.values()), probs  # they are there, only unusable
    assert set(rep.exclude_hosts) == {job.dumps[3]["host"]}
    states = {r.rank: r.state for r in rep.ranks}
    assert states[0] == states[1] == states[4] == "dump_unusable", states


def test_heartbeat_after_the_incident_means_alive(tmp_path: Path) -> None:
    """Rank 2 left no dump and its pid is gone now, but its watchdog beat after the incident."""
    job, proc = _gone_job(tmp_path, world=4)
    job.not_joined(3)
    job.dumps[2] = None
    sc = job.dumps[0]["side_channel"]
    sc["asked"] = sc["answered"] = [1, 3]  # nobody heard from rank 2 either way
    segment = Path("/dev/shm") / f"hetobs-stats-test-{uuid.uuid4().hex[:8]}-r2"
    job.metas[2]["stats_segment"] = str(segment)
    job_dir = job.write(tmp_path)
    segment.write_bytes(b"\0" * 64)  # a regular file where the segment should be: what is handed on
    seen: list[str] = []

    def heartbeat(path: str) -> int:
        seen.append(path)
        return T0 + 20_000_000_000  # 20 s after the incident

    try:
        rep = diagnose(Options(job_dir=job_dir, proc_root=proc, heartbeat=heartbeat))
    finally:
        segment.unlink()
    assert seen == [str(segment)]
    assert _blamed(rep) == {3}, [(v.kind.value, v.ranks, v.summary) for v in rep.verdicts]


def test_stats_segment_path_from_a_rank_file_is_not_opened_unless_it_is_a_segment(tmp_path: Path) -> None:
    job, proc = _gone_job(tmp_path, world=4)
    job.not_joined(3)
    job.dumps[2] = None
    fifo = tmp_path / "hetobs-stats-fifo-r2"
    os.mkfifo(fifo)
    job.metas[2]["stats_segment"] = str(fifo)
    job.metas[1]["stats_segment"] = "/etc/passwd"
    seen: list[str] = []
    diagnose(Options(job_dir=job.write(tmp_path), proc_root=proc, heartbeat=lambda p: seen.append(p) or None))
    assert seen == []


def test_symlinked_dump_is_refused_not_read(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(3)
    job_dir = job.write(tmp_path)
    inc = job_dir / "incidents" / job.incident
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(job.dumps[1]))  # a perfectly readable dump, but outside the job
    (inc / "rank-1.json").unlink()
    (inc / "rank-1.json").symlink_to(outside)
    (job_dir / "ranks" / "rank-2.json").unlink()
    (job_dir / "ranks" / "rank-2.json").symlink_to("/etc/passwd")
    rep = diagnose(Options(job_dir=job_dir, host_key="not-this-host"))
    probs = _problems(rep)
    assert "symbolic link" in probs[str(inc / "rank-1.json")], probs
    assert "symbolic link" in probs[str(job_dir / "ranks" / "rank-2.json")], probs
    assert _blamed(rep) == {3}
    assert {r.rank: r.state for r in rep.ranks}[1] == "dump_unusable"


def test_symlinked_directories_are_not_entered(tmp_path: Path) -> None:
    real = JobSpec(4, job="real")
    real.not_joined(3)
    real_dir = real.write(tmp_path / "elsewhere")
    job_dir = tmp_path / "jobs" / "job1"
    (job_dir / "incidents").mkdir(parents=True)
    (job_dir / "ranks").symlink_to(real_dir / "ranks")
    (job_dir / "incidents" / real.incident).symlink_to(real_dir / "incidents" / real.incident)
    rep = diagnose(Options(job_dir=job_dir, host_key="not-this-host"))
    assert rep.status == Status.NO_DATA
    probs = _problems(rep)
    assert "symbolic link" in probs[str(job_dir / "ranks")], probs
    assert "symbolic link" in probs[str(job_dir / "incidents" / real.incident)], probs
    # the root the user named may itself be a link (HETOBS_DIR on shared storage)
    (tmp_path / "link-to-job").symlink_to(real_dir)
    rep = diagnose(Options(job_dir=tmp_path / "link-to-job", host_key="not-this-host"))
    assert _blamed(rep) == {3}


def _diagnose_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hetobs.cli", "diagnose", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=DIAGNOSE_DEADLINE_S)
    except subprocess.TimeoutExpired as e:  # run() has killed it
        raise AssertionError(f"hetobs diagnose did not finish within {DIAGNOSE_DEADLINE_S} s: {e}") from None


def test_fifo_named_like_a_dump_does_not_block(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(3)
    job_dir = job.write(tmp_path)
    inc = job_dir / "incidents" / job.incident
    (inc / "rank-0.json").unlink()
    os.mkfifo(inc / "rank-0.json")
    os.mkfifo(inc / "rank-9.json")  # also one that nothing else would read (incident time scan)
    (job_dir / "ranks" / "rank-1.json").unlink()
    os.mkfifo(job_dir / "ranks" / "rank-1.json")
    proc = _diagnose_cli("--job", job.job, "--dir", str(tmp_path), "--json")
    assert proc.returncode == 1, proc.stderr
    rep = json.loads(proc.stdout)
    probs = {p["path"]: p["problem"] for p in rep["data_problems"]}
    assert "FIFO" in probs[str(inc / "rank-0.json")], probs
    assert "FIFO" in probs[str(job_dir / "ranks" / "rank-1.json")], probs
    assert {r for v in rep["verdicts"] for r in v["ranks"]} == {3}


def test_flight_recorder_dir_refuses_links_and_fifos(tmp_path: Path) -> None:
    fr = tmp_path / "fr"
    fr.mkdir()
    world = 3
    for r in range(world):
        n = 9 if r == 2 else 10
        doc = make_fr_dump(world, [make_fr_entry(s) for s in range(1, n + 1)])
        (fr / f"nccl_trace_rank_{r}").write_text(json.dumps(doc))
    outside = tmp_path / "outside"
    outside.write_text((fr / "nccl_trace_rank_1").read_text())
    (fr / "nccl_trace_rank_1").unlink()
    (fr / "nccl_trace_rank_1").symlink_to(outside)
    os.mkfifo(fr / "nccl_trace_rank_3")
    (tmp_path / "elsewhere").mkdir()
    (fr / "sub").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    proc = _diagnose_cli("--fr", str(fr), "--json")
    assert proc.returncode in (1, 3), proc.stderr
    rep = json.loads(proc.stdout)
    probs = {p["path"]: p["problem"] for p in rep["data_problems"]}
    assert "symbolic link" in probs[str(fr / "nccl_trace_rank_1")], probs
    assert "FIFO" in probs[str(fr / "nccl_trace_rank_3")], probs
