"""Bad input never spoils a scrape: each broken rank gets a mark and a log line, the rest are exported.

Real segments from a real 3-rank job; the broken ones are made from them:
- a segment of another layout version (a copy with the version field bumped),
- a truncated one and a foreign file under a rank's segment name,
- a stale segment of a dead process (rank 2 SIGKILLed: its segment stays behind),
- a vanished rank (rank 1's /dev/shm entry deleted after it was seen),
- an unwritable --textfile path (the CLI says so, exits 4, leaves no temp file).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _telemetry_job import RankJob  # noqa: E402
from telemetry_programs import expected_bytes  # noqa: E402

from hetobs import stats  # noqa: E402
from hetobs.exporters.prometheus import HetobsCollector  # noqa: E402
from hetobs.exporters.source import ShmSource  # noqa: E402

pytestmark = pytest.mark.slow

WORLD = 3


@pytest.fixture
def job(tmp_path: Path):
    j = RankJob("workload", WORLD, {"rounds": 1}, workdir=tmp_path)
    extra: list[str] = []
    j.extra_files = extra  # type: ignore[attr-defined]
    try:
        j.wait_all("phase1")
        yield j
    finally:
        j.close()
        for path in extra:
            if os.path.exists(path):
                os.unlink(path)


OTHER_VERSION = stats.VERSION + 1  # a layout this reader does not know


def _fake(job: RankJob, rank: int, data: bytes) -> str:
    path = f"/dev/shm/hetobs-stats-{job.job_id}-r{rank}"
    Path(path).write_bytes(data)
    job.extra_files.append(path)  # type: ignore[attr-defined]
    return path


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


def test_broken_segments_are_marked_and_others_exported(job: RankJob, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hetobs.exporters")
    source = ShmSource(job.job_id, job_dir=str(job.hetobs_dir / job.job_id))
    reg = CollectorRegistry()
    reg.register(HetobsCollector(source))
    j = job.job_id
    assert [e.rank for e in source.snapshot().ranks] == [0, 1, 2]  # rank 1 is seen once: it can vanish later

    good = Path(job.segments()[0]).read_bytes()
    _fake(job, 3, good[:8] + struct.pack("<I", OTHER_VERSION) + good[12:])  # another layout version
    _fake(job, 4, good[:5000])  # truncated
    _fake(job, 5, b"NOTOURS!" + good[8:])  # foreign
    os.unlink(f"/dev/shm/hetobs-stats-{j}-r1")  # vanished while its process lives
    os.killpg(job.procs[2].pid, signal.SIGKILL)  # dead: its segment stays behind
    job.procs[2].wait()

    want = float(sum(expected_bytes(WORLD, 1).values()))
    reg_bytes = sum(v.value for m in reg.collect() if m.name == "hetobs_collective_bytes"
                    for v in m.samples if v.labels["rank"] == "0")
    assert reg_bytes == want  # the healthy rank is exported in full
    assert _value(reg, "hetobs_rank_up", job_id=j, rank="0", host=os.uname().nodename) == 1.0
    for rank, problem in [("3", "version"), ("4", "truncated"), ("5", "foreign"), ("1", "vanished")]:
        assert _value(reg, "hetobs_segment_problem", job_id=j, rank=rank, problem=problem) == 1.0, rank
        assert _value(reg, "hetobs_rank_up", job_id=j, rank=rank, host=os.uname().nodename) == 0.0, rank
    # The dead rank: down, state dead, its counters kept as history (sums do not drop).
    host = os.uname().nodename
    assert _value(reg, "hetobs_rank_up", job_id=j, rank="2", host=host) == 0.0
    assert _value(reg, "hetobs_rank_state", job_id=j, rank="2", host=host, state="dead") == 1.0
    assert _value(reg, "hetobs_collective_bytes_total", job_id=j, rank="2", comm="0",
                  op="all_reduce") == float(expected_bytes(WORLD, 1)["all_reduce"])
    # One clear log line per broken rank, naming the file and the reason.
    text = caplog.text
    readable = ", ".join(str(v) for v in range(2, stats.VERSION + 1))
    assert (f"hetobs-stats-{j}-r3: stats layout version {OTHER_VERSION}, this hetobs reads versions "
            f"{readable}") in text
    assert f"hetobs-stats-{j}-r4: truncated" in text
    assert "not a hetobs stats segment" in text
    assert f"rank 1: /dev/shm/hetobs-stats-{j}-r1: segment gone" in text
    assert "rank 2:" in text and "is dead" in text
    # Logged once, not on every scrape.
    before = len(caplog.records)
    list(reg.collect())
    assert len(caplog.records) == before


def test_textfile_with_bad_segments_and_unwritable_path(job: RankJob, tmp_path: Path) -> None:
    good = Path(job.segments()[0]).read_bytes()
    _fake(job, 3, good[:8] + struct.pack("<I", 7) + good[12:])
    cli = [sys.executable, "-m", "hetobs.cli", "exporter", "--job", job.job_id, "--dir", str(job.hetobs_dir)]

    out = tmp_path / "node" / "hetobs.prom"
    out.parent.mkdir()
    r = subprocess.run(cli + ["--textfile", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    prom = out.read_text()
    assert f'hetobs_segment_problem{{job_id="{job.job_id}",problem="version",rank="3"}} 1.0' in prom
    assert f'hetobs_collective_bytes_total{{comm="0",job_id="{job.job_id}",op="all_reduce",rank="0"}}' in prom
    assert "stats layout version 7" in r.stderr and "rank 3" in r.stderr
    assert os.listdir(out.parent) == ["hetobs.prom"]  # written by rename: no temp file left

    # A directory where the file should go: the rename fails, the temp file is removed.
    r = subprocess.run(cli + ["--textfile", str(out.parent)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 4
    assert f"error: cannot write textfile {out.parent}:" in r.stderr
    assert not [n for n in os.listdir(tmp_path) if n.startswith("node.")]  # the temp name was node.<pid>.<tid>
    r = subprocess.run(cli + ["--textfile", str(tmp_path / "no" / "such" / "dir.prom")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 4 and "No such file or directory" in r.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "hetobs.cli", "exporter", "--job", "nosuchjob-port", "--port",
                            str(port), "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 4
    assert f"error: cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr


def test_textfile_interval_rewrites_until_sigterm(job: RankJob, tmp_path: Path) -> None:
    out = tmp_path / "hetobs.prom"
    proc = job.helper([sys.executable, "-m", "hetobs.cli", "exporter", "--job", job.job_id, "--textfile", str(out),
                       "--interval", "0.1"], log="textfile.log")
    end = time.monotonic() + 30
    versions: set[tuple[int, int]] = set()
    while len(versions) < 3 and time.monotonic() < end:  # each rewrite is a new file renamed into place
        try:
            st = out.stat()
            versions.add((st.st_ino, st.st_mtime_ns))
        except FileNotFoundError:
            pass
        time.sleep(0.02)  # watching a file another process rewrites, with a deadline
    assert len(versions) >= 3, job.log_text("textfile.log")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert "hetobs_collective_bytes_total" in out.read_text()
