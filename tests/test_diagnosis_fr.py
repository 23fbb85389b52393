"""`hetobs diagnose --fr`: PyTorch Flight Recorder dumps (JSON and pickle) through the same engine.

Synthetic NCCL-style dumps from tests/diagnosis_factory.py, plus real Gloo dumps taken
with torch 2.13 (tests/data/fr/gloo-missing-last, made by make.py there: 3 ranks, rank 2
has not called the last all_reduce). Gloo writes an empty pg_config, on which torch's
own analyzer crashes; hetobs takes membership from the ranks that recorded ops.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from diagnosis_factory import make_fr_dump, make_fr_entry
from hetobs.diagnosis import Options, Status, VerdictKind, diagnose
from hetobs.diagnosis.frloader import SafeUnpickler, UnsafePickleError, safe_loads

DATA = Path(__file__).parent / "data" / "fr" / "gloo-missing-last"


def write_fr(folder: Path, dumps: dict[int, dict], *, fmt: str = "json", prefix: str = "nccl_trace_rank_") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r, d in dumps.items():
        path = folder / f"{prefix}{r}"
        if fmt == "json":
            path.write_text(json.dumps(d))
        else:
            path.write_bytes(pickle.dumps(d))
    return folder


def missing_last(world: int, culprit: int, *, n: int = 20, gloo: bool = False) -> dict[int, dict]:
    out = {}
    for r in range(world):
        last = n - 1 if r == culprit else n
        entries = [make_fr_entry(s, backend="gloo" if gloo else "nccl",
                                 state="scheduled" if gloo else ("started" if s == n else "completed"))
                   for s in range(1, last + 1)]
        out[r] = make_fr_dump(world, entries, gloo=gloo)
    return out


@pytest.mark.parametrize("fmt", ["json", "pickle"])
@pytest.mark.parametrize("gloo", [False, True])
def test_missing_rank_named(tmp_path: Path, fmt: str, gloo: bool) -> None:
    folder = write_fr(tmp_path / "fr", missing_last(8, 5, gloo=gloo), fmt=fmt)
    rep = diagnose(Options(fr_dir=folder))
    assert rep.source == "flight_recorder" and rep.status == Status.FAULT
    assert [(v.kind, v.ranks, v.comm, v.seq, v.op) for v in rep.verdicts] == \
        [(VerdictKind.RANK_NOT_JOINED, [5], "0", 20, "all_reduce")]
    assert "train_step at train.py:42" in "\n".join(rep.verdicts[0].evidence)
    assert rep.world_size == 8 and rep.data_problems == []


def test_real_gloo_dumps_with_empty_pg_config(tmp_path: Path) -> None:
    for fmt in ("json", "pickle"):
        rep = diagnose(Options(fr_dir=DATA / fmt))
        assert [(v.kind, v.ranks, v.seq, v.op) for v in rep.verdicts] == [(VerdictKind.RANK_NOT_JOINED, [2], 6,
                                                                           "all_reduce")], fmt
        assert any("no membership in pg_config" in n for n in rep.notes)


def test_healthy_fr_dumps(tmp_path: Path) -> None:
    dumps = {r: make_fr_dump(4, [make_fr_entry(s) for s in range(1, 11)]) for r in range(4)}
    rep = diagnose(Options(fr_dir=write_fr(tmp_path / "fr", dumps)))
    assert rep.status == Status.HEALTHY and rep.verdicts == []


def test_fr_mismatch_by_majority(tmp_path: Path) -> None:
    dumps = {}
    for r in range(4):
        entries = [make_fr_entry(s) for s in range(1, 10)]
        entries.append(make_fr_entry(10, state="started", sizes=[[2048]] if r == 1 else [[1024]]))
        dumps[r] = make_fr_dump(4, entries)
    rep = diagnose(Options(fr_dir=write_fr(tmp_path / "fr", dumps)))
    assert [(v.kind, v.ranks, v.seq) for v in rep.verdicts] == [(VerdictKind.OP_MISMATCH, [1], 10)]
    assert "count 2048 instead of 1024" in "\n".join(rep.verdicts[0].evidence)


def test_fr_mismatch_two_ranks_has_no_majority(tmp_path: Path) -> None:
    dumps = {r: make_fr_dump(2, [make_fr_entry(1, op="all_reduce" if r == 0 else "broadcast", state="started")])
             for r in range(2)}
    rep = diagnose(Options(fr_dir=write_fr(tmp_path / "fr", dumps)))
    v = [v for v in rep.verdicts if v.kind == VerdictKind.OP_MISMATCH][0]
    assert v.ranks == [0, 1] and v.confidence < 0.5
    assert "no op has a majority" in "\n".join(v.evidence)


def test_malicious_pickle_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    dumps = missing_last(3, 2)
    folder = write_fr(tmp_path / "fr", dumps, fmt="pickle")
    (folder / "nccl_trace_rank_1").write_bytes(pickle.dumps({"version": "2.10", "entries": [Evil()]}))
    rep = diagnose(Options(fr_dir=folder))
    assert not marker.exists()
    probs = {Path(p.path).name: p.problem for p in rep.data_problems}
    assert "refused: the pickle references posix.system" in probs["nccl_trace_rank_1"]
    with pytest.raises(UnsafePickleError, match="refused"):
        safe_loads(pickle.dumps(Evil()))
    assert not marker.exists()


def test_safe_unpickler_builds_plain_data() -> None:
    data = {"a": [1, 2.5, None, True, b"x", ("t", 1)], "b": {"c": "d"}}
    assert safe_loads(pickle.dumps(data)) == data
    assert issubclass(SafeUnpickler, pickle.Unpickler)
    with pytest.raises(UnsafePickleError):
        safe_loads(pickle.dumps({1, 2}.__class__))  # even a builtin class reference


def test_corrupt_fr_files_are_data_problems(tmp_path: Path) -> None:
    folder = write_fr(tmp_path / "fr", missing_last(4, 3), fmt="json")
    text = (folder / "nccl_trace_rank_0").read_text()
    (folder / "nccl_trace_rank_0").write_text(text[:100])
    (folder / "nccl_trace_rank_1").write_bytes(pickle.dumps({"version": "2.10", "entries": []})[:10])
    rep = diagnose(Options(fr_dir=folder))
    probs = {Path(p.path).name: p.problem for p in rep.data_problems}
    assert probs["nccl_trace_rank_0"].startswith("truncated JSON")
    assert "pickle" in probs["nccl_trace_rank_1"]
    assert [v.ranks for v in rep.verdicts if v.kind.is_fault] == [[3]]


def test_empty_fr_dir(tmp_path: Path) -> None:
    (tmp_path / "fr").mkdir()
    rep = diagnose(Options(fr_dir=tmp_path / "fr"))
    assert rep.status == Status.NO_DATA and "no Flight Recorder dumps" in rep.data_problems[0].problem
