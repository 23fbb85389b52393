"""Dumps and rank files that do not grow with the world (issue 14 item 1, docs/dump-schema.md 2.0).

- real jobs: rank 0's dump + rank file at 16 ranks within 1.1x of 4 ranks' (same records,
  ring-sized all_reduces); the lowest rank wrote the comm's membership file (0600), every
  dump names it by hash, and no dump or rank file lists the world;
- the loader: a 2.0 incident is judged like its 1.x twin from the membership file; a
  missing or mismatched file is a data problem naming it, and nobody innocent is blamed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from diagnosis_factory import JobSpec, ring_progress
from hetobs.diagnosis import Options, VerdictKind, diagnose

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import dump_size  # noqa: E402  (the bench's own job runner: the test measures what the bench measures)


def _hash(members: list[int], ring: list[int]) -> str:
    text = "global_ranks=" + ",".join(map(str, members)) + ";ring=" + ",".join(map(str, ring))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- real jobs -------------------------------------------------------------------------

@pytest.mark.slow
def test_rank0_dump_and_rank_file_do_not_grow_with_the_world(tmp_path: Path) -> None:
    small = dump_size.measure(4, 40, tmp_path / "w4", timeout=120)
    big = dump_size.measure(16, 40, tmp_path / "w16", timeout=120)
    ratio = big["total_bytes"] / small["total_bytes"]
    assert ratio <= 1.1, f"16 ranks {big} vs 4 ranks {small}: {ratio:.3f}x"

    job_dir = Path(big["dump"]).parents[2]
    dump = json.loads(Path(big["dump"]).read_text())
    assert dump["version"] == "2.1"
    (c,) = dump["comms"]
    assert "global_ranks" not in c and "ring" not in c
    assert c["membership"]["lowest_rank"] == 0
    digest = c["membership"]["hash"]
    comm_file = job_dir / "comms" / f"comm-{c['comm_id']}-{digest}.json"
    assert oct(comm_file.stat().st_mode & 0o777) == "0o600"
    doc = json.loads(comm_file.read_text())
    assert doc["schema"] == "hetobs.comm" and doc["written_by"] == 0
    assert doc["global_ranks"] == list(range(16)) and doc["ring"] == list(range(16))
    assert _hash(doc["global_ranks"], doc["ring"]) == digest  # the same hash on both sides
    assert [f.name for f in (job_dir / "comms").iterdir()] == [comm_file.name], "one file per comm, no leftovers"
    assert {lk["global_peer"] for lk in c["links"]} == {1, 15}, "ring neighbours only: the others moved no data"
    rank_file = json.loads((job_dir / "ranks" / "rank-0.json").read_text())
    assert rank_file["version"] == "2.0" and "peers" not in rank_file
    assert rank_file["comms"][0]["membership"]["hash"] == digest
    assert sorted(rank_file["comms"][0]["transports"]) == ["1", "15"]


# --- the loader ------------------------------------------------------------------------

def _to_v2(job: JobSpec, root: Path, *, comm_file: bool = True) -> tuple[Path, Path]:
    """Write `job` as schema 2.0 would: membership by hash, lists once in comms/."""
    members = list(range(job.world))
    digest = _hash(members, members)

    def strip(c: dict[str, Any]) -> None:
        c.pop("global_ranks", None)
        c.pop("ring", None)
        c["membership"] = {"hash": digest, "lowest_rank": 0}

    for d in job.dumps.values():
        if d is not None:
            d["version"] = "2.0"
            for c in d["comms"]:
                strip(c)
    for m in job.metas.values():
        if m is not None:
            m["version"] = "2.0"
            for c in m["comms"]:
                strip(c)
    job_dir = job.write(root)
    path = job_dir / "comms" / f"comm-0-{digest}.json"
    if comm_file:
        path.parent.mkdir()
        path.write_text(json.dumps({"schema": "hetobs.comm", "version": "1.0", "job": job.job, "comm_id": 0,
                                    "hash": digest, "size": job.world, "written_by": 0, "global_ranks": members,
                                    "ring": members}))
    return job_dir, path


def _run(job_dir: Path):  # type: ignore[no-untyped-def]
    return diagnose(Options(job_dir=job_dir, host_key="not-this-host"))


def _faults(rep) -> list:  # type: ignore[no-untyped-def]
    return [v for v in rep.verdicts if v.kind.is_fault]


def _membership_problems(rep) -> list:  # type: ignore[no-untyped-def]
    return [p for p in rep.data_problems if "/comms/" in p.path]


def test_v2_rank_stalled_walks_the_ring_from_the_membership_file(tmp_path: Path) -> None:
    job = JobSpec(5, progress=ring_progress(list(range(5)), stalled_rank=3))
    rep = _run(_to_v2(job, tmp_path)[0])
    assert [v.kind for v in rep.verdicts] == [VerdictKind.RANK_STALLED] and rep.verdicts[0].ranks == [3]
    assert not _membership_problems(rep)


def test_v2_not_joined_named_and_old_dumps_still_load(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    v1 = _run(job.copy().write(tmp_path / "v1"))
    v2 = _run(_to_v2(job, tmp_path / "v2")[0])
    for rep in (v1, v2):
        assert [(v.kind, v.ranks) for v in _faults(rep)] == [(VerdictKind.RANK_NOT_JOINED, [2])]
        assert not rep.data_problems


@pytest.mark.parametrize("damage", ["missing", "edited", "not_json", "other_comm"])
def test_v2_unusable_membership_file_is_a_data_problem_and_blames_nobody_innocent(tmp_path: Path,
                                                                                  damage: str) -> None:
    job = JobSpec(5, progress=ring_progress(list(range(5)), stalled_rank=3))
    job.not_joined(1)
    job_dir, path = _to_v2(job, tmp_path, comm_file=damage != "missing")
    doc = json.loads(path.read_text()) if path.exists() else None
    if damage == "edited":  # someone reordered the ring: it no longer hashes to what the dumps say
        assert doc is not None
        doc["ring"] = [0, 2, 1, 3, 4]
        path.write_text(json.dumps(doc))
    elif damage == "not_json":
        path.write_text('{"schema": "hetobs.comm", "glob')
    elif damage == "other_comm":
        assert doc is not None
        doc["comm_id"] = 7
        path.write_text(json.dumps(doc))
    rep = _run(job_dir)
    (prob,) = _membership_problems(rep)
    assert prob.path == str(path)
    assert "membership of comm 0 (referred to by rank(s) 0-4)" in prob.problem
    want = {"missing": "missing", "edited": "does not hash to", "not_json": "truncated JSON",
            "other_comm": "says comm_id 7"}[damage]
    assert want in prob.problem, prob.problem
    # members come from the ranks' own comm ranks: the rank that never called seq 17 is still named
    assert [(v.kind, v.ranks) for v in _faults(rep)] == [(VerdictKind.RANK_NOT_JOINED, [1])]


def test_v2_missing_file_with_a_dump_missing_never_takes_outsiders_for_members(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    job.metas[3] = None
    job.drop_dump(3)
    job_dir, _ = _to_v2(job, tmp_path, comm_file=False)
    rep = _run(job_dir)
    assert _membership_problems(rep)
    assert all(set(v.ranks) <= {2, 3} for v in _faults(rep)), [(v.kind, v.ranks) for v in rep.verdicts]
    assert 2 in {r for v in _faults(rep) for r in v.ranks}


def test_v2_comm_file_through_a_symlink_is_refused(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    job_dir, path = _to_v2(job, tmp_path)
    real = tmp_path / "elsewhere.json"
    os.rename(path, real)
    os.symlink(real, path)
    rep = _run(job_dir)
    (prob,) = _membership_problems(rep)
    assert "link" in prob.problem


# --- parallel reading ------------------------------------------------------------------

def _report_json(job_dir: Path) -> str:
    return json.dumps(_run(job_dir).to_dict(), sort_keys=True)


def _parallel_job(tmp_path: Path) -> Path:
    job = JobSpec(40, progress=ring_progress(list(range(40)), stalled_rank=3))
    job.not_joined(11)
    job_dir, _ = _to_v2(job, tmp_path)
    inc = job_dir / "incidents" / job.incident
    (inc / "rank-7.json").write_text('{"schema": "hetobs.dump", "vers')  # a truncated one
    d5 = json.loads((inc / "rank-5.json").read_text())  # one 1.x dump among them: read in the parent
    d5["version"] = "1.1"
    d5["comms"][0]["global_ranks"] = d5["comms"][0]["ring"] = list(range(40))
    del d5["comms"][0]["membership"]
    (inc / "rank-5.json").write_text(json.dumps(d5))
    return job_dir


def test_parallel_read_gives_the_serial_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers read the dumps and the report is the serial one. The workers are not forked
    from this process: a forked worker would inherit the patched reader below and leave a mark."""
    from hetobs.diagnosis import loader, parallel

    job_dir = _parallel_job(tmp_path)
    serial = _report_json(job_dir)
    here: list[list[int]] = []  # what this process read itself
    marks = tmp_path / "forked-workers"
    real = loader._load_each

    def recording(folder, files, *a, **kw):  # type: ignore[no-untyped-def]
        if os.getpid() == me:
            here.append([r for r, _ in files])
        else:
            marks.write_text(str(os.getpid()))
        return real(folder, files, *a, **kw)

    me = os.getpid()
    monkeypatch.setattr(loader, "_load_each", recording)
    monkeypatch.setattr(parallel, "MIN_FILES", 4)
    para = _report_json(job_dir)
    # the dumps were read by the workers; only the 1.x one came back here (then rank 7's metadata:
    # the ranks without a usable dump need theirs)
    assert here == [[5], [7]], here
    assert not marks.exists(), "a worker ran this process's patched code: it was forked"
    assert para == serial
    assert '"rank_not_joined"' in para and "truncated JSON" in para


def test_a_pool_that_cannot_start_is_a_note_and_the_reading_complete(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from hetobs.diagnosis import parallel

    job_dir = _parallel_job(tmp_path)
    serial = _run(job_dir).to_dict()
    monkeypatch.setattr(parallel, "MIN_FILES", 4)
    monkeypatch.setattr(parallel, "START_METHODS", ("no-such-start-method",))
    rep = _run(job_dir).to_dict()
    (note,) = [n for n in rep["notes"] if n.startswith("parallel dump reading failed")]
    assert "at start (OSError" in note and "40 dump file(s)" in note, note
    rep["notes"].remove(note)
    assert rep == serial


def test_a_worker_that_fails_is_a_note_and_the_reading_complete(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers forked (the start method hetobs never uses) get no descriptor: their initializer
    raises, the pool breaks, the note says so and the parent reads everything."""
    from hetobs.diagnosis import parallel

    job_dir = _parallel_job(tmp_path)
    serial = _run(job_dir).to_dict()
    monkeypatch.setattr(parallel, "MIN_FILES", 4)
    monkeypatch.setattr(parallel, "START_METHODS", ("fork",))
    rep = _run(job_dir).to_dict()
    (note,) = [n for n in rep["notes"] if n.startswith("parallel dump reading failed")]
    assert "at worker (BrokenProcessPool" in note and "40 dump file(s)" in note, note
    rep["notes"].remove(note)
    assert rep == serial
