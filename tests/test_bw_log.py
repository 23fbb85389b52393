"""HETOBS_BW_LOG (BCCL-style bandwidth log) from real 2-rank jobs."""

from __future__ import annotations

import re
from pathlib import Path

from _inline import InlineJob

BODY = """
import numpy as np, hetobs
comm = hetobs.init()
x = np.ones(4096, np.float32)
for _ in range(57):
    comm.all_reduce(x)
out = np.empty(2 * 1000, np.float32)
for _ in range(5):
    comm.all_gather(out, np.ones(1000, np.float32))
"""

LINE = re.compile(r"hetobs bw rank=(\d) comm=0 seq=(\d+) op=(\w+) bytes=(\d+) time_us=([\d.]+) "
                  r"algbw_GBps=([\d.]+) busbw_GBps=([\d.]+)$")


def test_verbose_writes_one_line_per_collective(tmp_path: Path) -> None:
    logs = tmp_path / "bw-%r.log"
    with InlineJob(BODY, 2, tmp_path, env={"HETOBS_BW_LOG": "verbose", "HETOBS_BW_LOG_FILE": str(logs)}) as job:
        runs = job.wait()
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    for rank in (0, 1):
        lines = (tmp_path / f"bw-{rank}.log").read_text().splitlines()
        parsed = [LINE.match(line) for line in lines]
        assert all(parsed), [line for line, m in zip(lines, parsed) if not m]
        ops = [(m.group(3), int(m.group(4))) for m in parsed if m]
        assert ops == [("all_reduce", 4096 * 4)] * 57 + [("all_gather", 2000 * 4)] * 5
        assert [int(m.group(2)) for m in parsed if m] == list(range(1, 63))
        for m in parsed:
            assert m and float(m.group(5)) > 0 and float(m.group(6)) > 0
            factor = {"all_reduce": 1.0, "all_gather": 0.5}[m.group(3)]  # nccl-tests factors at 2 ranks
            assert abs(float(m.group(7)) - float(m.group(6)) * factor) <= 0.002


def test_agg_writes_counts_per_comm_and_op(tmp_path: Path) -> None:
    with InlineJob(BODY, 2, tmp_path, env={"HETOBS_BW_LOG": "agg", "HETOBS_BW_LOG_INTERVAL": "30"}) as job:
        runs = job.wait()
    agg = re.compile(r"hetobs bw-agg rank=0 comm=0 op=(\w+) interval_s=[\d.]+ count=(\d+) bytes=(\d+) "
                     r"busbw_GBps mean=([\d.]+) min=([\d.]+) max=([\d.]+)")
    found = {m.group(1): m for m in map(agg.search, runs[0].stderr.splitlines()) if m}
    assert int(found["all_reduce"].group(2)) == 57 and int(found["all_reduce"].group(3)) == 57 * 16384
    assert int(found["all_gather"].group(2)) == 5
    mean, lo, hi = (float(found["all_reduce"].group(i)) for i in (4, 5, 6))
    assert 0 < lo <= mean <= hi


def test_bad_mode_is_a_clear_error(tmp_path: Path) -> None:
    with InlineJob("import hetobs; hetobs.init()", 1, tmp_path, env={"HETOBS_BW_LOG": "loud"}) as job:
        [run] = job.wait()
    assert run.returncode != 0
    assert "HETOBS_BW_LOG='loud': expected one of off, verbose, agg" in run.stderr
