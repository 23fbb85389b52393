"""Another local user cannot plant or capture a job's files (issue 13 item 4).

Directories made first by someone else (here: owned by `nobody`, mode 0777), a stats
segment of theirs under the rank's name, or a link in its place: the job runs, says once
which directory it refuses, and writes nothing there; readers (the stats reader, `hetobs
diagnose`) refuse another user's files unless told to trust them. Needs root to chown.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from _inline import InlineJob
from hetobs import stats

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")]

NOBODY = 65534

BODY = """
import numpy as np, hetobs, time
comm = hetobs.init()
x = np.ones(1000, np.float32)
for i in range(4):
    if i == 2 and comm.rank == 1 and HANG:
        time.sleep(2.5)  # the watchdog (HETOBS_HANG_TIMEOUT=1) dumps while rank 0 waits
    comm.all_reduce(x)
print("DONE", flush=True)
"""
HANG_ENV = {"HETOBS_HANG_TIMEOUT": "1", "HETOBS_TIMEOUT": "30"}


def _body(hang: bool) -> str:
    return f"HANG = {hang}\n" + BODY


def _foreign_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o777)


def _everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _warnings_naming(stderr: str, what: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if what in ln and "hetobs writes nothing there" in ln]


@pytest.mark.parametrize("foreign", ["job_dir", "root"])
def test_directory_of_another_user_is_refused_and_the_job_runs(tmp_path: Path, foreign: str) -> None:
    job_id = f"lu{uuid.uuid4().hex[:10]}"
    root = tmp_path / "hetobs"
    refused = root / job_id if foreign == "job_dir" else root
    root.mkdir(mode=0o700)
    _foreign_dir(refused)
    with InlineJob(_body(True), 2, tmp_path, env={"HETOBS_JOB_ID": job_id, **HANG_ENV}) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 and "DONE" in r.stdout for r in runs), [r.stderr for r in runs]
    for r in runs:
        said = _warnings_naming(r.stderr, str(refused))
        assert len(said) == 1, r.stderr
        assert "owned by uid 65534" in said[0]
        assert "hang detected" in r.stderr or r.rank == 1  # the dump was due, and was not written
    assert _everything_under(refused) == []  # no rank file, no incident, not even a folder


def test_planted_stats_segment_and_link_are_left_alone(tmp_path: Path) -> None:
    job_id = f"lu{uuid.uuid4().hex[:10]}"
    planted = Path(f"/dev/shm/hetobs-stats-{job_id}-r0")
    link = Path(f"/dev/shm/hetobs-stats-{job_id}-r1")
    victim = tmp_path / "victim"
    victim.write_bytes(b"not a segment: must stay as it is")
    try:
        planted.write_bytes(b"planted by another user")
        os.chown(planted, NOBODY, NOBODY)
        os.chmod(planted, 0o666)
        link.symlink_to(victim)
        with InlineJob(_body(False), 2, tmp_path, env={"HETOBS_JOB_ID": job_id}) as job:
            runs = job.wait(60)
        assert all(r.returncode == 0 and "DONE" in r.stdout for r in runs), [r.stderr for r in runs]
        assert planted.read_bytes() == b"planted by another user"
        assert victim.read_bytes() == b"not a segment: must stay as it is"
        assert link.is_symlink()
        assert "belongs to uid 65534" in runs[0].stderr, runs[0].stderr
        with pytest.raises(stats.StatsError, match="owned by uid 65534"):
            stats.read_segment(str(planted))
        with pytest.raises(stats.StatsError, match="cannot open"):
            stats.read_segment(str(link))  # not followed
    finally:
        for p in (planted, link):
            if p.is_symlink() or p.exists():
                p.unlink()


def _diagnose(root: Path, job_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job_id, "--dir", str(root),
                           "--json", *extra], capture_output=True, text=True, timeout=120)


def test_diagnose_refuses_a_job_dir_of_another_user_unless_trusted(tmp_path: Path) -> None:
    with InlineJob(_body(True), 2, tmp_path, env=HANG_ENV) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    job_dir = job.dir / job.job_id
    assert list((job_dir / "incidents").iterdir()), "the hang must have been dumped"
    os.chown(job_dir, NOBODY, NOBODY)
    refused = _diagnose(job.dir, job.job_id)
    assert refused.returncode == 3, refused.stderr
    report = json.loads(refused.stdout)
    assert report["status"] == "no_data"
    assert "--trust-dir" in refused.stderr and "owned by uid 65534" in refused.stderr, refused.stderr
    # one line naming the refused directory, as dump, top, trace and plan say it
    [line] = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert f"error: no usable data: {job_dir}: job directory is owned by uid 65534" in line, refused.stderr
    trusted = _diagnose(job.dir, job.job_id, "--trust-dir")
    assert trusted.returncode == 1, trusted.stderr  # the hang's fault, found in the trusted directory
    assert json.loads(trusted.stdout)["status"] == "fault"


def test_report_batch_writes_nothing_into_a_job_dir_of_another_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    from hetobs.plan import report_batch

    job_id = f"lu{uuid.uuid4().hex[:10]}"
    root = tmp_path / "hetobs"
    root.mkdir(mode=0o700)
    _foreign_dir(root / job_id)
    monkeypatch.setenv("HETOBS_DIR", str(root))
    monkeypatch.setenv("HETOBS_JOB_ID", job_id)
    with caplog.at_level("WARNING", logger="hetobs.plan"):
        report_batch(8, rank=0)
        report_batch(9, rank=0)
    assert _everything_under(root / job_id) == []
    said = [r.getMessage() for r in caplog.records if str(root / job_id) in r.getMessage()]
    assert len(said) == 1 and "owned by uid 65534" in said[0], caplog.text


@pytest.mark.skipif(not shutil.which("unshare"), reason="a private mount namespace needs util-linux's unshare")
def test_control_socket_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    # /tmp/hetobs-<uid> is shared by every job of this user on the node: it is replaced by a
    # tmpfs of nobody's, mode 0777, in a private mount namespace of this test's ranks only.
    sock_dir = f"/tmp/hetobs-{os.getuid()}"
    private = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
               f"mkdir -p {sock_dir} && mount -t tmpfs -o mode=0777,uid={NOBODY},gid={NOBODY} tmpfs {sock_dir} && "
               f'"$@"; rc=$?; ls -A {sock_dir}; exit $rc', "sh"]
    with InlineJob(_body(False), 2, tmp_path, prefix=[private, private]) as job:
        runs = job.wait(60)
    for r in runs:
        assert r.returncode == 0 and "DONE" in r.stdout, r.stderr
        said = [ln for ln in r.stderr.splitlines() if f"directory {sock_dir} is owned by uid 65534" in ln]
        assert len(said) == 1 and "no per-rank control socket" in said[0], r.stderr
        assert r.stdout.strip().splitlines()[-1] == "DONE", "nothing may be left in the refused directory"
