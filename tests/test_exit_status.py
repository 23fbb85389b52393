"""`exited_cleanly` means it: the rank file records how the process really ended.

Real rank processes (2 ranks, one collective) leave in each way a training script can:
returning, sys.exit(0), sys.exit(1), an uncaught exception, a fatal signal, os._exit.
Only the first two are clean; `exit_status` is {"code": what exit() was given} or, for a
fatal signal that can be caught, {"signal": N}; none when os._exit skipped everything. Then the diagnosis uses it: a rank that exited with
an error before the incident and left no dump is dead at the incident; one that exited
with an error after it was alive then and is not blamed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from _inline import InlineJob
from diagnosis_factory import T0, JobSpec, fake_proc, local_key
from hetobs.diagnosis import Options, diagnose

BODY = """
import os, signal, sys
import numpy as np
import hetobs
comm = hetobs.init()
comm.all_reduce(np.ones(16, np.float32))
how = {how!r}
if how == "sys_exit_1":
    sys.exit(1)
if how == "sys_exit_0":
    sys.exit(0)
if how == "sys_exit_256":
    sys.exit(256)  # the parent sees 0
if how == "raise":
    raise RuntimeError("uncaught on purpose")
if how == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
if how == "sigsegv":
    import ctypes
    ctypes.string_at(0)  # a real crash
if how == "os_exit":
    os._exit(3)
"""

CASES = [  # how, process return code, exited_cleanly, exit_status
    ("return", 0, True, {"code": 0}),
    ("sys_exit_0", 0, True, {"code": 0}),
    ("sys_exit_256", 0, True, {"code": 0}),
    ("sys_exit_1", 1, False, {"code": 1}),
    ("raise", 1, False, {"code": 1}),
    ("sigterm", -15, False, {"signal": 15}),
    ("sigsegv", -11, False, {"signal": 11}),
    ("os_exit", 3, False, None),
]


def _rank_file(job: InlineJob, rank: int) -> dict[str, Any]:
    return json.loads((job.dir / job.job_id / "ranks" / f"rank-{rank}.json").read_text())


@pytest.mark.parametrize("how,returncode,clean,status", CASES)
def test_rank_file_records_how_the_process_ended(tmp_path: Path, how: str, returncode: int, clean: bool,
                                                 status: Optional[dict[str, int]]) -> None:
    with InlineJob(BODY.format(how=how), 2, tmp_path) as job:
        runs = job.wait(90)
        assert [r.returncode for r in runs] == [returncode] * 2, [r.stderr[-2000:] for r in runs]
        for r in range(2):
            doc = _rank_file(job, r)
            assert doc["exited_cleanly"] is clean, (how, doc)
            assert doc.get("exit_status") == status, (how, doc)
            assert doc["comms"] and doc["stats_segment"], "the exit-time rewrite keeps what was there"


def _job_with_exit(tmp_path: Path, exit_dt_s: float) -> tuple[Path, Path]:
    """Rank 2 left no dump; its rank file says it exited with status 1, exit_dt_s from the incident."""
    proc = fake_proc(tmp_path / "proc", {})
    job = JobSpec(4, host_key=local_key(proc))
    job.not_joined(3)
    job.dumps[2] = None
    sc = job.dumps[0]["side_channel"]
    sc["asked"] = sc["answered"] = [1, 3]
    meta = job.metas[2]
    meta["exited_cleanly"] = False
    meta["exit_time_ns"] = T0 + int(exit_dt_s * 1e9)
    meta["exit_status"] = {"code": 1}
    return job.write(tmp_path), proc


def _faults(rep: Any) -> list[tuple[str, list[int]]]:
    return [(v.kind.value, v.ranks) for v in rep.verdicts if v.kind.is_fault]


def test_error_exit_before_the_incident_is_dead(tmp_path: Path) -> None:
    job_dir, proc = _job_with_exit(tmp_path, -30.0)
    rep = diagnose(Options(job_dir=job_dir, proc_root=proc))
    assert ("rank_dead", [2]) in _faults(rep), _faults(rep)
    v = next(v for v in rep.verdicts if v.ranks == [2])
    assert v.confidence >= 0.9 and any("exited with status 1" in e for e in v.evidence), v.evidence


def test_error_exit_after_the_incident_is_not_blamed(tmp_path: Path) -> None:
    job_dir, proc = _job_with_exit(tmp_path, 30.0)
    rep = diagnose(Options(job_dir=job_dir, proc_root=proc))
    assert _faults(rep) == [("rank_not_joined", [3])], _faults(rep)


def _killed(tmp_path: Path, exit_dt_s: float) -> Any:
    job_dir, proc = _job_with_exit(tmp_path, exit_dt_s)
    path = job_dir / "ranks" / "rank-2.json"
    doc = json.loads(path.read_text())
    doc["exit_status"] = {"signal": 15}
    path.write_text(json.dumps(doc))
    return diagnose(Options(job_dir=job_dir, proc_root=proc))


def test_killed_by_a_signal_after_the_incident_is_not_blamed(tmp_path: Path) -> None:
    """The scheduler's SIGTERM after the hang: the rank lived through the incident."""
    rep = _killed(tmp_path, 30.0)
    assert _faults(rep) == [("rank_not_joined", [3])], _faults(rep)


def test_killed_by_a_signal_before_the_incident_is_dead(tmp_path: Path) -> None:
    rep = _killed(tmp_path, -30.0)
    v = next(v for v in rep.verdicts if v.ranks == [2])
    assert v.kind.value == "rank_dead" and any("killed by signal 15 (SIGTERM)" in e for e in v.evidence), v.evidence


def test_nonzero_code_is_never_clean_even_if_marked_so(tmp_path: Path) -> None:
    """An older writer marked sys.exit(1) clean; the status in the same file wins."""
    job_dir, proc = _job_with_exit(tmp_path, -30.0)
    path = job_dir / "ranks" / "rank-2.json"
    doc = json.loads(path.read_text())
    doc["exited_cleanly"] = True
    path.write_text(json.dumps(doc))
    rep = diagnose(Options(job_dir=job_dir, proc_root=proc))
    assert ("rank_dead", [2]) in _faults(rep), _faults(rep)
