"""hetobs.launch_local and hetobs.line_reader: real processes, no hetobs job (fast).

Ranks here are small `python -c` programs: what they print and how they end is the test.
"""

from __future__ import annotations

import json
import os
import select
import sys
from pathlib import Path

import pytest

from hetobs.launch_local import LocalJob
from hetobs.line_reader import LineEnd, LineReader, LineTimeout

# Each rank starts a child in its own process group (the rank's session), then says both
# pids on stdout and waits for stdin to close.
_FAMILY = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("PIDS", os.getpid(), child.pid, flush=True)
sys.stdin.read()
"""


def _gone_within(pid: int, timeout: float) -> bool:
    """True once `pid` exited (a pidfd turns readable; a zombie counts), False after `timeout`."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _family_pids(job: LocalJob) -> list[int]:
    lines = LineReader([p.stdout.fileno() for p in job.procs if p.stdout is not None])
    got = lines.read(range(job.world), timeout=60)
    pids = []
    for r in range(job.world):
        word, rank_pid, child_pid = got[r].split()
        assert word == b"PIDS" and int(rank_pid) == job.pids[r]
        pids += [int(rank_pid), int(child_pid)]
    return pids


def test_close_kills_every_rank_and_what_it_started(tmp_path: Path) -> None:
    job = LocalJob([sys.executable, "-c", _FAMILY], 3, log_dir=tmp_path, hetobs_dir=tmp_path / "h", stdin="pipe",
                   stdout="pipe")
    with job:
        pids = _family_pids(job)
        assert not job.wait(0.2)  # they wait on stdin: the deadline passes
    assert all(_gone_within(pid, 10) for pid in pids)
    exits = job.exits()
    assert [x.returncode for x in exits] == [-9, -9, -9] and all(x.killed for x in exits)


def test_an_exception_kills_the_ranks(tmp_path: Path) -> None:
    job = LocalJob([sys.executable, "-c", _FAMILY], 2, log_dir=tmp_path, hetobs_dir=tmp_path / "h", stdin="pipe",
                   stdout="pipe")
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="the caller failed"):
        with job:
            pids = _family_pids(job)
            raise RuntimeError("the caller failed")
    assert len(pids) == 4 and all(_gone_within(pid, 10) for pid in pids)


_FAIL = """
import os, sys
rank = int(os.environ["RANK"])
print("working on rank", rank, flush=True)
if rank == 1:
    print("step 1 of 2 done", file=sys.stderr)
    print("boom: rank 1 gave up", file=sys.stderr)
    sys.exit(3)
"""


def test_a_failed_rank_is_reported_with_its_tail(tmp_path: Path) -> None:
    with LocalJob([sys.executable, "-c", _FAIL], 3, log_dir=tmp_path, hetobs_dir=tmp_path / "h") as job:
        assert job.wait(60)
    exits = job.exits()
    assert [x.returncode for x in exits] == [0, 3, 0]
    assert [x.failed for x in exits] == [False, True, False] and not any(x.killed for x in exits)
    assert exits[1].stderr_tail == "step 1 of 2 done\nboom: rank 1 gave up"
    assert exits[1].stdout_tail == "working on rank 1"
    assert exits[0].stderr_tail == ""


def test_fail_fast_returns_on_the_first_failure(tmp_path: Path) -> None:
    # rank 0 fails at once; rank 1 waits on stdin, which stays open until close()
    prog = "import os, sys\nif os.environ['RANK'] == '0': sys.exit(5)\nsys.stdin.read()"
    with LocalJob([sys.executable, "-c", prog], 2, log_dir=tmp_path, hetobs_dir=tmp_path / "h",
                  stdin="pipe") as job:
        assert job.wait(60, fail_fast=True)
        assert [x.returncode for x in job.exits()] == [5, None]
    assert job.exits()[1].returncode == -9


_ENV = """
import json, os
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HETOBS_JOB_ID",
        "HETOBS_DIR", "JOB_WIDE", "PER_RANK", "REMOVED"]
print(json.dumps({k: os.environ.get(k) for k in keys}))
"""


def test_rank_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOVED", "inherited")
    monkeypatch.setenv("RANK", "7")  # a launcher's own rank never leaks into its ranks
    job = LocalJob([sys.executable, "-c", _ENV], 2, log_dir=tmp_path, hetobs_dir=tmp_path / "h", job_id="j-env",
                   env={"JOB_WIDE": "yes", "REMOVED": None}, rank_env={1: {"PER_RANK": "one", "JOB_WIDE": "no"}},
                   stdout="merge")
    with job:
        assert job.wait(60)
    envs = [json.loads(job.log_path(r, "out").read_text()) for r in range(2)]
    port = str(job.master_port)
    assert envs[0] == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "HETOBS_JOB_ID": "j-env",
                       "HETOBS_DIR": str(tmp_path / "h"), "JOB_WIDE": "yes", "PER_RANK": None, "REMOVED": None}
    assert (envs[1]["RANK"], envs[1]["JOB_WIDE"], envs[1]["PER_RANK"]) == ("1", "no", "one")
    assert job.log_path(0, "out") == job.log_path(0, "err")  # merged


def test_line_reader_end_and_timeout(tmp_path: Path) -> None:
    # rank 0 prints a line then waits; rank 1 prints half a line and exits
    prog = ("import os, sys\nif os.environ['RANK'] == '0':\n    print('hello', flush=True); sys.stdin.read()\n"
            "else:\n    sys.stdout.write('no newline')")
    with LocalJob([sys.executable, "-c", prog], 2, log_dir=tmp_path, hetobs_dir=tmp_path / "h", stdin="pipe",
                  stdout="pipe") as job:
        lines = LineReader([p.stdout.fileno() for p in job.procs if p.stdout is not None])
        assert lines.read([0], timeout=60) == {0: b"hello"}
        with pytest.raises(LineEnd) as end:
            lines.read([1], timeout=60)
        assert end.value.source == 1 and lines.seen(1) == "no newline"
        with pytest.raises(LineTimeout) as late:
            lines.read([0], timeout=0.2)
        assert late.value.missing == [0]
