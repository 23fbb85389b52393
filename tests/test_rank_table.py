"""The report's per-rank table (`ranks[].waiting_on`) reads whom a rank waits on from its dump's
`in_flight.waiting_on` (2.1), and only for dumps without it from the progress counters.

Synthetic dumps (tests/diagnosis_factory.py): four ranks in a ring all_reduce whose link
1 -> 2 stalled, so every rank joined and no stuck-op-level "never joined" list stands in
front of the rank's own view."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagnosis_factory import JobSpec, ring_progress
from hetobs.diagnosis import Options, diagnose


def _stalled_ring() -> JobSpec:
    return JobSpec(4, progress=ring_progress([0, 1, 2, 3], stalled_link=(1, 2)))


def _row(job_dir: Path, rank: int) -> Any:
    rep = diagnose(Options(job_dir=job_dir, host_key="not-this-host"))
    return next(r for r in rep.ranks if r.rank == rank)


def test_waiting_on_comes_from_the_dump_field(tmp_path: Path) -> None:
    """Rank 0 still sends to rank 1 and receives from rank 3: `waiting_on` names both (the
    progress counters alone would give only the receive side); and a field that says something
    else than the counters wins, so it is the field that is read."""
    job = _stalled_ring()
    assert _row(job.write(tmp_path / "a"), 0).waiting_on == [1, 3]
    job.comm(0)["in_flight"]["waiting_on"] = [{"rank": 2, "direction": "recv", "posted": 1, "done": 0}]
    assert _row(job.write(tmp_path / "b"), 0).waiting_on == [2]


def test_dumps_without_the_field_fall_back_to_progress(tmp_path: Path) -> None:
    job = _stalled_ring()
    for r in range(4):
        dump = job.dumps[r]
        assert dump is not None
        dump["version"] = "2.0"
        del job.comm(r)["in_flight"]["waiting_on"]
    row = _row(job.write(tmp_path), 0)
    assert (row.state, row.waiting_on) == ("in_op", [3])  # received less than posted from rank 3 only
