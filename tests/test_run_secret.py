"""`hetobs run` without HETOBS_SECRET: the job's owner reaches the job, nobody else does.

The generated secret is stored in the job directory (0600 in a 0700 directory); `hetobs
dump`, `diagnose --window` and `top` of the same user use it with nothing set; another
user is refused with one line naming the directory; a planted or linked secret file is
refused like any other planted file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from _launch import free_port
from hetobs.jobs import SECRET_FILE, job_secret, read_secret, store_secret
from hetobs.ownership import UntrustedJobDir

NOBODY = 65534

# A launcher in the style of torchrun: one process per rank with the torchrun variables.
LAUNCHER = """
import os, subprocess, sys
body, world, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
procs = [subprocess.Popen([sys.executable, "-c", body], env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=port)) for r in range(world)]
sys.exit(max(p.wait() for p in procs))
"""

# Runs until the stop file appears; all_reduce keeps the window of `diagnose --window` fresh.
RANK = """
import os, sys, time, numpy as np, hetobs
comm = hetobs.init()
x = np.ones(1024, np.float32)
comm.all_reduce(x)
os.write(1, f"READY {comm.rank}\\n".encode())  # one write: the ranks share the pipe
stop = os.environ["TEST_STOP_FILE"]
while True:
    done = np.array([os.path.exists(stop)], np.int32)
    comm.all_reduce(done, op="max")  # every rank leaves at the same op
    if done[0]:
        break
    time.sleep(0.02)  # pace: a live job doing work, not a busy loop on two shared cores
os.write(1, f"DONE {comm.rank}\\n".encode())
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETOBS_") and
           k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") and not k.startswith("SLURM_")}
    return {**env, "HETOBS_DEBUG": "ERROR", "OMP_NUM_THREADS": "1", **extra}


def _hetobs(*args: str, env: dict[str, str] | None = None, user: int | None = None
            ) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hetobs.cli", *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, env=env or _env(), capture_output=True, text=True, timeout=120)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A HETOBS_DIR other users can read (0755), as shared roots on a cluster often are; the
    job directory inside it is the job's own (0700)."""
    root = Path(f"/tmp/hetobs-runsecret-{uuid.uuid4().hex[:10]}")
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_run_then_dump_diagnose_top_with_nothing_set_and_another_user_refused(shared_root: Path) -> None:
    job = f"rs{uuid.uuid4().hex[:10]}"
    stop = shared_root / "stop"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hetobs.cli", "run", "--job", job, "--dir", str(shared_root), "--",
         sys.executable, "-c", LAUNCHER, RANK, "2", str(free_port())],
        env=_env(TEST_STOP_FILE=str(stop)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        assert launcher.stdout is not None
        ready = [launcher.stdout.readline().split() for _ in range(2)]
        assert sorted(r[:2] for r in ready) == [["READY", "0"], ["READY", "1"]], (ready, launcher.stderr)
        job_dir = shared_root / job
        secret = job_dir / SECRET_FILE
        assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700 and stat.S_IMODE(secret.stat().st_mode) == 0o600

        dump = _hetobs("dump", "--job", job, "--dir", str(shared_root), "--json")
        assert dump.returncode == 0, dump.stderr
        assert sorted(json.loads(dump.stdout)["files"]) == ["0", "1"]

        window = _hetobs("diagnose", "--job", job, "--dir", str(shared_root), "--window", "2", "--json")
        assert window.returncode == 0, window.stderr
        assert json.loads(window.stdout)["status"] == "healthy"

        top = _hetobs("top", "--job", job, "--dir", str(shared_root), "--once", "--json")
        assert top.returncode == 0, top.stderr
        assert [r["rank"] for r in json.loads(top.stdout)["ranks"]] == [0, 1]

        # The caller's own HETOBS_SECRET wins over the stored one: a wrong one is refused by the ranks.
        wrong = _hetobs("dump", "--job", job, "--dir", str(shared_root), "--json", "--timeout", "2",
                        env=_env(HETOBS_SECRET="not-this-jobs"))
        assert wrong.returncode == 1 and json.loads(wrong.stdout)["answered"] == [], wrong.stdout

        for cmd in (["dump"], ["diagnose", "--window", "2"]):
            other = _hetobs(*cmd, "--job", job, "--dir", str(shared_root), user=NOBODY)
            lines = other.stderr.strip().splitlines()
            assert other.returncode == 3 and len(lines) == 1, other.stderr
            assert str(job_dir) in lines[0] and "cannot" in lines[0] and "Traceback" not in other.stderr, lines

        stop.touch()
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err
        assert out.count("DONE") == 2
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
        for name in os.listdir("/dev/shm"):
            if name.startswith(f"hetobs-stats-{job}-"):
                os.unlink(os.path.join("/dev/shm", name))


def _run_true(root: Path, job: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _hetobs("run", "--job", job, "--dir", str(root), "--", "sh", "-c", 'echo "$HETOBS_SECRET"', env=_env(**env))


def test_generated_secret_is_stored_and_kept_and_a_given_one_is_not_stored(tmp_path: Path) -> None:
    first = _run_true(tmp_path, "j1")
    again = _run_true(tmp_path, "j1")  # the same job id started again keeps its secret
    assert first.returncode == again.returncode == 0, first.stderr
    assert len(first.stdout.strip()) == 64 and again.stdout == first.stdout
    assert (tmp_path / "j1" / SECRET_FILE).read_text().strip() == first.stdout.strip()
    given = _run_true(tmp_path, "j2", HETOBS_SECRET="mine")
    assert given.stdout.strip() == "mine" and not (tmp_path / "j2" / SECRET_FILE).exists()


@pytest.mark.parametrize("plant", ["link", "open_mode", "fifo"])
def test_planted_secret_is_refused_by_run_and_by_readers(tmp_path: Path, plant: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    job_dir = tmp_path / "j"
    job_dir.mkdir(mode=0o700)
    secret = job_dir / SECRET_FILE
    if plant == "link":
        (tmp_path / "theirs").write_text("known-to-them\n")
        secret.symlink_to(tmp_path / "theirs")
    elif plant == "open_mode":
        secret.write_text("known-to-them\n")
        secret.chmod(0o644)
    else:
        os.mkfifo(secret, 0o600)  # a reader must not block on it
    run = _run_true(tmp_path, "j")
    assert run.returncode == 2 and str(secret) in run.stderr and run.stdout == "", run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    monkeypatch.delenv("HETOBS_SECRET", raising=False)
    with pytest.raises(UntrustedJobDir, match=str(secret)):
        job_secret(str(job_dir))
    monkeypatch.setenv("HETOBS_SECRET", "given")
    assert job_secret(str(job_dir)) == "given"  # the caller's own is used without reading the file


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_secret_or_job_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UntrustedJobDir, match="owned by uid 65534"):
        store_secret(str(theirs), "x")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / SECRET_FILE).write_text("planted\n")
    (mine / SECRET_FILE).chmod(0o600)
    os.chown(mine / SECRET_FILE, NOBODY, NOBODY)
    with pytest.raises(UntrustedJobDir, match="owned by uid 65534"):
        read_secret(str(mine))
    assert read_secret(str(mine), trust=True) == "planted"  # --trust-dir: an administrator reading a user's job
