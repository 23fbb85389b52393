"""Job identity on first contact: torchrun's TORCHELASTIC_RUN_ID=none is not an id.

Two torchrun-style jobs on one machine at once, neither with an id of its own: each must
agree on one id (rank 0's, handed out at rendezvous or through the store) that the other
job does not have, so both have their own job directory and stats segments, both show
up in `hetobs jobs`, and the exporter's source sees each job's ranks. Rank 0 logs the id
once; the HETOBS_SECRET warning comes once per job, not once per rank. Segment lookup
matches names exactly: job "train" never picks up "train-r1".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pytest

from _launch import free_port

if TYPE_CHECKING:
    from conftest import Launcher

SHM = Path("/dev/shm")
UNSET_ID = {"HETOBS_JOB_ID": "", "SLURM_JOB_ID": "", "TORCHELASTIC_RUN_ID": "none"}
SECRET_WARNING = "HETOBS_SECRET is not set"


@pytest.fixture
def shm_cleanup(launcher: "Launcher") -> Iterator[None]:
    """Segments are named by the agreed id, which the launcher does not know: after the test,
    remove any new hetobs-stats-* segment whose process is one of this test's (now dead) ranks."""
    yield
    launcher.close()
    _remove_segments_of({pid for job in launcher.jobs for pid in job.pids})


def _hetobs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", *args], capture_output=True, text=True, timeout=60)


def _two_jobs(launcher: "Launcher", tmp_path: Path, store: bool) -> list[Any]:
    shared = tmp_path / "shared-hetobs"
    shared.mkdir()
    jobs = [launcher("job_identity", 2, {"store": store}, gates=["release-0", "release-1"],
                     env={**UNSET_ID, "HETOBS_DIR": str(shared), "HETOBS_CONNECT_TIMEOUT": "20"},
                     deadline=90.0, master_port=free_port()) for _ in range(2)]
    return jobs


def _check_two_jobs(jobs: list[Any], shared: Path) -> list[str]:
    from hetobs.exporters.source import ShmSource

    ids = []
    for job in jobs:
        joined = [job.wait_event(r, "joined", timeout=60) for r in range(2)]
        assert joined[0]["job"] == joined[1]["job"], joined
        assert joined[0]["sum"] == 2.0
        ids.append(joined[0]["job"])
    assert ids[0] != ids[1] and "none" not in ids and all(ids), ids

    listing = _hetobs("jobs", "--dir", str(shared), "--json")
    assert listing.returncode == 0, listing.stderr
    doc = json.loads(listing.stdout)
    by_id = {j["job"]: j for j in doc["jobs"]}
    for job_id in ids:
        entry = by_id[job_id]
        assert entry["state"] == "running" and entry["ranks"] == 2 and entry["world_size"] == 2, entry
        assert entry["hosts"] and entry["start_time_ns"] and entry["start_time"], entry
        # the exporter's view: each job's own two live ranks, nothing of the other job
        snap = ShmSource(job_id, job_dir=str(shared / job_id)).snapshot()
        assert [e.rank for e in snap.ranks] == [0, 1] and all(e.live for e in snap.ranks), snap
        assert {e.stats.job for e in snap.ranks if e.stats} == {job_id}

    for job in jobs:
        for r in range(2):
            job.gate_open(f"release-{r}")
    for job, job_id in zip(jobs, ids):
        res = job.wait()
        assert [r["job"] for r in res.check()] == [job_id, job_id]
        err = [r.stderr for r in res.ranks]
        # the id is logged once, by rank 0; the secret warning once per job
        assert sum(e.count(f"job id {job_id}") for e in err) == 1 and f"job id {job_id}" in err[0], err
        assert sum(e.count(SECRET_WARNING) for e in err) == 1 and SECRET_WARNING in err[0], err
    done = json.loads(_hetobs("jobs", "--dir", str(shared), "--json").stdout)
    assert {j["job"]: j["state"] for j in done["jobs"]} == {ids[0]: "exited", ids[1]: "exited"}
    return ids


def test_two_torchrun_jobs_agree_on_distinct_ids(launcher: "Launcher", shm_cleanup: None, tmp_path: Path) -> None:
    """MASTER_ADDR rendezvous (hosted by rank 0): both jobs live at once, distinct ids, both visible."""
    jobs = _two_jobs(launcher, tmp_path, store=False)
    _check_two_jobs(jobs, tmp_path / "shared-hetobs")


def test_store_rendezvous_agrees_on_one_id(launcher: "Launcher", shm_cleanup: None, tmp_path: Path) -> None:
    """hetobs.init(store=TCPStore), the path the torch backends take: rank 0's id through the store."""
    pytest.importorskip("torch")
    jobs = _two_jobs(launcher, tmp_path, store=True)
    _check_two_jobs(jobs, tmp_path / "shared-hetobs")


def test_placeholder_run_id_is_not_an_id() -> None:
    from hetobs.config import from_env

    for placeholder in ("none", "None", " none "):
        s = from_env({"TORCHELASTIC_RUN_ID": placeholder})
        assert s.job_id_generated and s.job_id != placeholder.strip()
    s = from_env({"TORCHELASTIC_RUN_ID": "run-7"})
    assert (s.job_id, s.job_id_generated) == ("run-7", False)


def test_segment_lookup_matches_names_exactly(tmp_path: Path) -> None:
    from hetobs import stats
    from hetobs.exporters.source import ShmSource

    for name in ("hetobs-stats-train-r0", "hetobs-stats-train-r1", "hetobs-stats-train-r1-r0",
                 "hetobs-stats-train-r1-r1", "hetobs-stats-train-rx", "hetobs-stats-trainer-r0"):
        (tmp_path / name).write_bytes(b"x" * 16)  # unreadable on purpose: the name alone decides
    assert [os.path.basename(p) for p in stats.segment_paths("train", str(tmp_path))] == [
        "hetobs-stats-train-r0", "hetobs-stats-train-r1"]
    assert [os.path.basename(p) for p in stats.segment_paths("train-r1", str(tmp_path))] == [
        "hetobs-stats-train-r1-r0", "hetobs-stats-train-r1-r1"]
    snap = ShmSource("train", shm_dir=str(tmp_path)).snapshot()
    assert [(e.rank, os.path.basename(e.path)) for e in snap.ranks] == [
        (0, "hetobs-stats-train-r0"), (1, "hetobs-stats-train-r1")]


def _rank_file(job_dir: Path, rank: int, **fields: Any) -> None:
    import socket

    (job_dir / "ranks").mkdir(parents=True, exist_ok=True)
    data = {"schema": "hetobs.rank", "version": "1.0", "job": job_dir.name, "rank": rank, "world_size": 2,
            "host": socket.gethostname(), "start_time_ns": 1_796_000_000_000_000_000 + rank, **fields}
    (job_dir / "ranks" / f"rank-{rank}.json").write_text(json.dumps(data))


def test_jobs_lists_states_and_survives_bad_files(tmp_path: Path) -> None:
    """running (a live local process), exited (clean), dead (gone, not clean); a corrupt rank file
    is a counted problem, a stray directory is no job, and no traceback ever."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with open(f"/proc/{os.getpid()}/stat") as f:
        my_start = int(f.read().rsplit(")", 1)[1].split()[19])
    _rank_file(tmp_path / "alive", 0, pid=os.getpid(), process_start_time=my_start)
    _rank_file(tmp_path / "alive", 1, pid=gone.pid, exited_cleanly=True)
    _rank_file(tmp_path / "clean", 0, pid=gone.pid, exited_cleanly=True)
    _rank_file(tmp_path / "crashed", 0, pid=gone.pid)
    _rank_file(tmp_path / "crashed", 1, pid="not a pid")
    (tmp_path / "crashed" / "ranks" / "rank-2.json").write_text("{truncated")
    (tmp_path / "not-a-job").mkdir()
    r = _hetobs("jobs", "--dir", str(tmp_path), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    jobs = {j["job"]: j for j in json.loads(r.stdout)["jobs"]}
    assert set(jobs) == {"alive", "clean", "crashed"}
    assert jobs["alive"]["state"] == "running" and jobs["alive"]["rank_states"] == {"0": "running", "1": "exited"}
    assert jobs["clean"]["state"] == "exited"
    assert jobs["crashed"]["state"] == "dead" and jobs["crashed"]["ranks"] == 3
    assert list(jobs["crashed"]["problems"]) == ["2"]
    human = _hetobs("jobs", "--dir", str(tmp_path))
    assert human.returncode == 0 and "crashed" in human.stdout and "dead" in human.stdout, human.stderr
    assert _hetobs("jobs", "--dir", str(tmp_path / "nothing-here")).returncode == 0


def test_secret_warning_once_per_job(tmp_path: Path) -> None:
    """Three ranks with a set job id and no secret: one warning line for the job, from rank 0."""
    from _inline import InlineJob

    body = "import numpy as np, hetobs\nc = hetobs.init()\nc.all_reduce(np.ones(4, np.float32))\nc.close()\n"
    with InlineJob(body, 3, tmp_path, transport="tcp") as job:
        runs = job.wait(timeout=60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    counts = [r.stderr.count(SECRET_WARNING) for r in runs]
    assert counts == [1, 0, 0], [r.stderr for r in runs]


def test_generated_id_rendezvous_keeps_strangers_out(tmp_path: Path) -> None:
    """With HETOBS_SECRET and no job id, a process without the secret that claims rank 1 at the
    rendezvous is refused; the real rank 1 then joins and both ranks run under rank 0's id."""
    import signal

    body = ("import os, numpy as np, hetobs\nfrom hetobs import _core\nc = hetobs.init()\n"
            "x = np.ones(4, np.float32)\nc.all_reduce(x)\n"
            "print('JOB', os.path.basename(_core.runtime_info()['job_dir']), x[0], flush=True)\nc.close()\n")
    port = str(free_port())
    base = {k: v for k, v in os.environ.items() if not k.startswith("HETOBS_")}
    base.update(UNSET_ID, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, HETOBS_TRANSPORT="tcp",
                HETOBS_DIR=str(tmp_path / "hetobs"), HETOBS_CONNECT_TIMEOUT="30", PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen[str]] = []

    def start(rank: int, **extra: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-c", body], env={**base, "RANK": str(rank), **extra},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(p)
        return p

    try:
        r0 = start(0, HETOBS_SECRET="s3cret")
        stranger = start(1)  # no secret
        _, s_err = stranger.communicate(timeout=60)
        assert stranger.returncode != 0 and "refused the handshake" in s_err, s_err
        r1 = start(1, HETOBS_SECRET="s3cret")
        outs = [p.communicate(timeout=60) for p in (r0, r1)]
        assert r0.returncode == 0 and r1.returncode == 0, outs
        jobs = {out.split()[1] for out, _ in outs}
        assert len(jobs) == 1 and "none" not in jobs, outs
        assert "refused a connection" in outs[0][1], outs[0][1]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
        _remove_segments_of({p.pid for p in procs})


def _remove_segments_of(pids: set[int]) -> None:
    """Segments left by the given (dead) processes: ranks that exit cleanly remove their own."""
    from hetobs import stats

    for name in os.listdir(SHM):
        if not name.startswith("hetobs-stats-"):
            continue
        try:
            if stats.read_segment(str(SHM / name)).pid in pids:
                (SHM / name).unlink(missing_ok=True)
        except stats.StatsError:
            continue
