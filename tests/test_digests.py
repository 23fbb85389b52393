"""Silent data corruption caught where it happens (HETOBS_DIGEST, csrc/include/hetobs/collectives/digest.h).

Real 3-rank jobs: the native test hook (HETOBS_TEST_FLIP_BIT) flips one bit of one rank's
result of one op; with digests on, every rank raises DataMismatchError naming that rank, the
op, its seq and the flipped element, over shared memory and TCP, on the direct and the ring
paths, for all_reduce, all_gather and broadcast. The exporter counts the mismatch on that
rank only, and `hetobs diagnose` gives a `data_mismatch` verdict naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _telemetry_job import RankJob, metric_by_rank  # noqa: E402

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).resolve().parent / "arrival_programs.py"
WORLD, FLIP_RANK, FLIP_SEQ, STEPS = 3, 2, 12, 16


def _job(tmp_path: Path, transport: str, op: str, elements: int, element: int, *, diagnose: bool = False,
         env: dict[str, str] | None = None) -> tuple[list[dict], dict[int, float], dict | None]:
    args = {"steps": STEPS, "op": op, "elements": elements, "flip_rank": FLIP_RANK, "flip_seq": FLIP_SEQ,
            "flip_element": element, "flip_bit": 22}
    with RankJob("digest", WORLD, args, workdir=tmp_path, programs=PROGRAMS,
                 env={"HETOBS_TRANSPORT": transport, "HETOBS_DIGEST": "1", "HETOBS_DIGEST_RATE": "1", **(env or {})}
                 ) as job:
        done = sorted(job.wait_all("done", timeout=120), key=lambda e: e["rank"])
        counts = metric_by_rank(job.job_id, "hetobs_data_mismatches")
        job.send("exit")
        for p in job.procs:
            assert p.wait(timeout=60) == 0
        report = None
        if diagnose:
            r = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job.job_id, "--dir",
                                str(job.hetobs_dir), "--json"], capture_output=True, text=True, timeout=120)
            assert r.returncode == 1, r.stderr
            report = json.loads(r.stdout)
    return done, counts, report


@pytest.mark.parametrize("transport,op,elements,element", [
    ("shm", "all_reduce", 100_000, 54_321),  # ring (single copy)
    ("tcp", "all_reduce", 100_000, 99_999),  # pipelined TCP ring, the last element
    ("shm", "all_reduce", 16, 5),            # direct, mail slots
    ("tcp", "all_gather", 3000, 7_777),      # the gathered output
    ("shm", "broadcast", 5000, 0),           # chain
])
def test_flipped_bit_names_the_rank_op_seq_and_element(tmp_path: Path, transport: str, op: str, elements: int,
                                                      element: int) -> None:
    done, counts, report = _job(tmp_path, transport, op, elements, element,
                                diagnose=(transport, op) == ("shm", "all_reduce") and elements > 1000)
    for d in done:  # every rank was told, once, with the same fields
        assert d["caught"] == [{"ranks": [FLIP_RANK], "op": op, "seq": FLIP_SEQ, "element": element, "comm": 0}], d
    assert counts.get(FLIP_RANK) == 1 and all(counts.get(r, 0) == 0 for r in range(WORLD) if r != FLIP_RANK), counts
    if report is not None:
        found = [v for v in report["verdicts"] if v["kind"] == "data_mismatch"]
        assert len(found) == 1 and found[0]["ranks"] == [FLIP_RANK] and found[0]["seq"] == FLIP_SEQ, report
        assert report["status"] == "fault"


def test_log_action_goes_on_and_no_flip_no_mismatch(tmp_path: Path) -> None:
    """HETOBS_DIGEST_ACTION=log: nothing raised, the mismatch still counted on the flipped rank."""
    done, counts, _ = _job(tmp_path, "shm", "all_reduce", 1000, 3, env={"HETOBS_DIGEST_ACTION": "log"})
    assert all(d["caught"] == [] for d in done)
    assert counts.get(FLIP_RANK) == 1 and sum(counts.values()) == 1, counts


def _torch_job(tmp_path: Path, op: str, elements: int, element: int) -> tuple[list[dict], dict[int, float], dict, Any]:
    args = {"steps": STEPS, "op": op, "elements": elements, "flip_rank": FLIP_RANK, "flip_seq": FLIP_SEQ,
            "flip_element": element, "flip_bit": 22}
    with RankJob("torch_digest", WORLD, args, workdir=tmp_path, programs=PROGRAMS,
                 env={"HETOBS_DIGEST": "1", "HETOBS_DIGEST_RATE": "1", "GLOO_SOCKET_IFNAME": "lo"}) as job:
        done = sorted(job.wait_all("done", timeout=180), key=lambda e: e["rank"])
        counts = metric_by_rank(job.job_id, "hetobs_data_mismatches")
        job.send("exit")
        for p in job.procs:
            assert p.wait(timeout=60) == 0
        from hetobs.diagnosis.loader import load_job
        from hetobs.diagnosis.types import Options

        loaded = load_job(Options(job_dir=job.hetobs_dir / job.job_id, tail_entries=64))
        r = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job.job_id, "--dir",
                            str(job.hetobs_dir), "--json"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
    return done, counts, json.loads(r.stdout), loaded


@pytest.mark.parametrize("op,elements,element", [
    ("all_reduce", 100_000, 54_321),
    ("all_gather_into_tensor", 3000, 7_777),
    ("all_gather", 3000, 8_999),  # a list of outputs: checked as one flat run of elements
    ("broadcast", 5000, 0),
])
def test_wrapped_gloo_flipped_bit_is_named(tmp_path: Path, op: str, elements: int, element: int) -> None:
    """hetobs_gloo (torch's Gloo, wrapped by hetobs._torch_ext): the digests go through Gloo's own
    all_gather; every rank is told by a DistBackendError at the same op, the dumps name rank 2,
    the seq and the element as fields, the exporter counts it on rank 2, diagnose names rank 2."""
    done, counts, report, loaded = _torch_job(tmp_path, op, elements, element)
    steps = {tuple(e["step"] for e in d["caught"]) for d in done}
    assert len(steps) == 1 and len(next(iter(steps))) == 1, done  # one op raised, the same on every rank
    assert all(c["type"] == "DistBackendError" for d in done for c in d["caught"]), done
    infos = [d.cause_info for d in loaded.dumps.values() if d.cause_info is not None]
    assert len(infos) == WORLD, loaded.problems
    for ci in infos:
        assert (ci.kind, ci.culprits, ci.op, ci.seq, ci.element) == ("data_mismatch", (FLIP_RANK,), op.split("_into")[0],
                                                                     FLIP_SEQ, element), ci
    assert counts.get(FLIP_RANK) == 1 and sum(counts.values()) == 1, counts
    found = [v for v in report["verdicts"] if v["kind"] == "data_mismatch"]
    assert len(found) == 1 and found[0]["ranks"] == [FLIP_RANK] and found[0]["seq"] == FLIP_SEQ, report
