"""`hetobs trace` writes Chrome/Perfetto trace events from live record rings and from an incident.

The incident is a real hang: ranks loop all_reduce, one is SIGSTOPped, the others'
watchdogs dump (hang timeout 2 s); the trace then shows each dumping rank's in-flight
op running up to its dump, next to the ops before it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _telemetry_job import RankJob  # noqa: E402
from telemetry_programs import WORKLOAD  # noqa: E402

pytestmark = pytest.mark.slow


def _trace(job: RankJob, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", "trace", "--job", job.job_id, "--dir",
                           str(job.hetobs_dir), "-o", str(out), *extra], capture_output=True, text=True, timeout=60)


def _ops(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_live_trace_has_a_track_per_rank_and_comm(tmp_path: Path) -> None:
    with RankJob("workload", 2, {"rounds": 2}, workdir=tmp_path) as job:
        job.wait_all("phase1")
        out = tmp_path / "live.json"
        r = _trace(job, out, "--live")
        assert r.returncode == 0, r.stderr
        assert "ops of 2 ranks from the live record rings" in r.stderr
    doc = json.loads(out.read_text())
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert meta[("process_name", 0, None)]["name"].startswith("rank 0 (")
    assert meta[("thread_name", 1, 1)] == {"name": "comm 0"}
    ops = _ops(doc)
    per_rank = Counter(e["pid"] for e in ops)
    assert per_rank == {0: 2 * (len(WORKLOAD) + 2), 1: 2 * (len(WORKLOAD) + 2)}
    coll = sorted(e["args"]["collective_seq_id"] for e in ops if e["pid"] == 0 and e["cat"] == "collective")
    assert coll == list(range(1, 2 * len(WORKLOAD) + 1))
    for e in ops:
        assert e["tid"] == 1 and e["ts"] >= 0 and e["dur"] > 0 and e["args"]["state"] == "completed"
        assert e["name"].split(" #")[0] in {op for op, *_ in WORKLOAD} | {"send", "recv"}
    assert doc["otherData"]["source"] == "live record rings" and doc["otherData"]["comms"] == {"1": "0"}


def test_incident_trace_shows_the_stall(tmp_path: Path) -> None:
    with RankJob("workload", 3, {"rounds": 1}, workdir=tmp_path, env={"HETOBS_HANG_TIMEOUT": "2"}) as job:
        job.wait_all("phase1")
        job.send("loop")
        job.wait_all("looping")
        victim = job.procs[2].pid
        os.kill(victim, signal.SIGSTOP)
        os.waitpid(victim, os.WUNTRACED)
        try:
            incidents = job.hetobs_dir / job.job_id / "incidents"
            end = time.monotonic() + 30
            while time.monotonic() < end:  # dumps appear by rename: wait for both live ranks' files
                if any({p.name for p in d.glob("rank-*.json")} >= {"rank-0.json", "rank-1.json"}
                       for d in incidents.glob("hang-*")):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"no hang dumps from ranks 0 and 1 in {incidents}")
            out = tmp_path / "incident.json"
            r = _trace(job, out)
            assert r.returncode == 0, r.stderr
        finally:
            os.kill(victim, signal.SIGCONT)
    doc = json.loads(out.read_text())
    assert doc["otherData"]["source"].startswith("incident hang-")
    ops = _ops(doc)
    stalled = [e for e in ops if e["args"].get("in_flight")]
    assert {e["pid"] for e in stalled} >= {0, 1}
    for e in stalled:
        assert e["name"].startswith("all_reduce #") and e["dur"] >= 1.8e6  # µs: it ran into the 2 s hang timeout
        done_before = [o for o in ops if o["pid"] == e["pid"] and not o["args"].get("in_flight")]
        assert done_before and max(o["ts"] for o in done_before) <= e["ts"]
    dumps = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert {e["pid"] for e in dumps} >= {0, 1} and all("cause" in e["args"] for e in dumps)


def test_trace_without_data_is_no_data(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "hetobs.cli", "trace", "--job", "nosuchjob-trace", "--dir",
                        str(tmp_path), "-o", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "no readable stats segment" in r.stderr
    assert not (tmp_path / "t.json").exists()
