"""The dump readers never raise: malformed files are data problems, odd values are tolerated.

One job of 4 ranks (rank 3 never joined) from tests/diagnosis_factory.py; one of its
files is replaced by each malformed variant in turn — truncated at many offsets, nested
deeper than Python recurses, not UTF-8, numbers too big for any field, every field of
the wrong type — and read through the real loaders (hetobs dump, rank metadata, Flight
Recorder JSON and pickle) and then the whole engine. Each variant must either load or
be a data problem naming its file, the engine must finish, and an innocent rank must
never be blamed because a file was odd. Seeded, so a failure reproduces.
"""

from __future__ import annotations

import copy
import json
import pickle
import random
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from diagnosis_factory import JobSpec, make_fr_dump, make_fr_entry
from hetobs.diagnosis import Options, diagnose
from hetobs.diagnosis.fastread import IntListTable, read_document
from hetobs.diagnosis.frloader import load_fr
from hetobs.diagnosis.loader import load_job

SEED = 20261201
DEEP = 200_000  # far beyond sys.getrecursionlimit()

Variant = tuple[str, bytes, bool]  # (name, content, must be a data problem)
# A field of the wrong type or value (comm_id -1, op null) makes a different dump, not
# an unreadable one: what the engine concludes from it is the matcher's business, not
# the reader's. Such variants ("type:", "value:") only have to load without raising;
# the others (the file is unusable) must also blame no innocent rank.


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


def _kind(v: Any) -> str:
    return "value:" if isinstance(v, (int, float)) and not isinstance(v, bool) else "type:"


def _wrong_types(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """Every top-level field (and the comm/in-flight/peer ones) set to values of each wrong type."""
    odd_values: list[Any] = [None, True, -1, 2**64, 1e308, "x", "", [], [1, "a", None], {}, {"a": [1]}]
    identifying = {"schema", "version", "rank"}
    for key in doc:
        for i, v in enumerate(odd_values):
            yield f"{_kind(v)}{key}#{i}", _set(doc, (key,), v), key in identifying and v != doc[key]
    if doc.get("comms"):
        for key in list(doc["comms"][0]):
            for i, v in enumerate(odd_values):
                yield f"{_kind(v)}comms[0].{key}#{i}", _set(doc, ("comms", 0, key), v), False
        flight = doc["comms"][0].get("in_flight")
        if isinstance(flight, dict):
            for key in list(flight):
                for i, v in enumerate(odd_values):
                    yield f"{_kind(v)}in_flight.{key}#{i}", _set(doc, ("comms", 0, "in_flight", key), v), False
            if flight.get("peers"):
                for key in list(flight["peers"][0]):
                    for i, v in enumerate(odd_values):
                        at = ("comms", 0, "in_flight", "peers", 0, key)
                        yield f"{_kind(v)}peers[0].{key}#{i}", _set(doc, at, v), False
    if doc.get("entries"):
        for key in list(doc["entries"][-1]):
            for i, v in enumerate(odd_values):
                yield f"{_kind(v)}entries[-1].{key}#{i}", _set(doc, ("entries", -1, key), v), False


def variants(doc: dict[str, Any], rng: random.Random) -> Iterator[Variant]:
    good = json.dumps(doc).encode()
    cuts = sorted({*range(0, 64), *range(len(good) - 64, len(good)), *rng.sample(range(len(good)), 60)})
    for n in cuts:
        yield f"truncated@{n}", good[:n], True
    yield "nested-arrays", b"[" * DEEP, True
    yield "nested-closed", b"[" * DEEP + b"]" * DEEP, True
    yield "nested-objects", b'{"a":' * DEEP + b"1" + b"}" * DEEP, True
    # valid JSON, only deeper than Python recurses: loading it or refusing it are both fine
    yield "nested-in-field", good[:-1] + b', "python": ' + b"[" * DEEP + b"]" * DEEP + b"}", False
    yield "nested-in-entries", good.replace(b'"entries": [', b'"entries": [' + b"[" * DEEP + b"]" * DEEP + b",", 1), \
        False
    yield "random-bytes", rng.randbytes(4096), True
    yield "nul-bytes", b"\0" * 100, True
    yield "utf16", json.dumps(doc).encode("utf-16"), True
    yield "latin1-in-text", good.replace(b'"peer_request"', b'"peer_r\xe9quest\xff"', 1), False
    yield "cut-utf8-in-text", good.replace(b'"peer_request"', b'"peer_\xe2\x82"', 1), False
    yield "lone-surrogate-escape", good.replace(b'"peer_request"', b'"\\ud800x"', 1), False
    yield "huge-int-digits", good[:-1] + b', "later_field": ' + b"9" * 5000 + b"}", True
    yield "huge-float", good.replace(b'"hang_timeout_s": 3.0', b'"hang_timeout_s": 1e999', 1), False
    yield "nan", good.replace(b'"hang_timeout_s": 3.0', b'"hang_timeout_s": NaN', 1), False
    yield "huge-world", good.replace(b'"world_size": 4', b'"world_size": 1000000000000000000', 1), False
    yield "huge-rank-in-ring", good.replace(b'"ring": [0,', b'"ring": [1000000000000000000, 0,', 1), False
    yield "not-an-object", b"[1, 2, 3]", True
    yield "a-string", b'"hetobs.dump"', True
    yield "empty", b"", True
    yield "whitespace", b" \n\t ", True
    yield "duplicate-keys", good[:-1] + b', "rank": 2}', True
    for name, bent, problem in _wrong_types(doc):
        yield name, json.dumps(bent).encode(), problem


def _check_job(job_dir: Path, bad: Path, name: str, must_fail: bool, rank: int, what: str) -> None:
    loaded = load_job(Options(job_dir=job_dir, host_key="not-this-host"))
    problems = [p for p in loaded.problems if p.path == str(bad)]
    usable = rank in getattr(loaded, what)
    assert usable or problems, f"{name}: neither loaded nor a data problem"
    if must_fail:
        assert problems and not usable, f"{name}: should be a data problem"
    rep = diagnose(Options(job_dir=job_dir, host_key="not-this-host"))
    if name.startswith(("type:", "value:")) and not must_fail:
        return
    blamed = {r for v in rep.verdicts if v.kind.is_fault for r in v.ranks}
    assert blamed <= {3}, f"{name}: blamed {blamed}: {[v.summary for v in rep.verdicts]}"


def _job(tmp_path: Path) -> tuple[JobSpec, Path]:
    job = JobSpec(4)
    job.not_joined(3)
    return job, job.write(tmp_path)


def test_malformed_dumps_never_raise(tmp_path: Path) -> None:
    job, job_dir = _job(tmp_path)
    bad = job_dir / "incidents" / job.incident / "rank-1.json"
    n = 0
    for name, content, must_fail in variants(job.dumps[1], random.Random(SEED)):
        bad.write_bytes(content)
        _check_job(job_dir, bad, name, must_fail, 1, "dumps")
        n += 1
    assert n > 300


def test_malformed_rank_metadata_never_raises(tmp_path: Path) -> None:
    job, job_dir = _job(tmp_path)
    (job_dir / "incidents" / job.incident / "rank-1.json").unlink()  # so rank 1's metadata is read
    bad = job_dir / "ranks" / "rank-1.json"
    for name, content, must_fail in variants(job.metas[1], random.Random(SEED + 1)):
        bad.write_bytes(content)
        _check_job(job_dir, bad, name, must_fail, 1, "metas")


def test_invalid_utf8_inside_a_text_keeps_the_dump(tmp_path: Path) -> None:
    """What older native writers left in error texts costs one character, not the whole dump."""
    job, job_dir = _job(tmp_path)
    bad = job_dir / "incidents" / job.incident / "rank-1.json"
    bad.write_bytes(bad.read_bytes().replace(b'"peer_request"', b'"peer_\xe2\x82"', 1))
    loaded = load_job(Options(job_dir=job_dir, host_key="not-this-host"))
    assert loaded.dumps[1].reason == "peer_\ufffd"


@pytest.mark.parametrize("text", [b"[" * DEEP, b'{"a":' * DEEP, b"[" * DEEP + b"]" * DEEP])
def test_read_document_raises_value_error_only(text: bytes) -> None:
    for keep in (0, 5):
        with pytest.raises(ValueError):
            read_document(text, IntListTable(), keep)


def _fr_variants(rng: random.Random) -> Iterator[tuple[str, Callable[[Path], None], bool]]:
    doc = make_fr_dump(3, [make_fr_entry(s) for s in range(1, 11)])
    for name, content, must_fail in variants(doc, rng):
        if name.startswith(("type:", "value:")) or name == "duplicate-keys":
            must_fail = False  # FR has no identifying fields beyond being an object
        yield f"json:{name}", (lambda p, c=content: p.write_bytes(c)), must_fail
    good = pickle.dumps(doc)
    for n in sorted({1, 2, 5, len(good) // 2, len(good) - 1, *rng.sample(range(1, len(good)), 20)}):
        yield f"pickle-truncated@{n}", (lambda p, c=good[:n]: p.write_bytes(c)), True
    yield "pickle-not-a-dict", (lambda p: p.write_bytes(pickle.dumps([1, 2]))), True
    yield "pickle-nested", (lambda p: p.write_bytes(b"\x80\x04" + b"]" * DEEP + b".")), True
    yield "pickle-global", (lambda p: p.write_bytes(pickle.dumps(Path("/etc/passwd")))), True
    yield "pickle-random", (lambda p: p.write_bytes(b"\x80" + rng.randbytes(2000))), True


def test_malformed_flight_recorder_files_never_raise(tmp_path: Path) -> None:
    fr = tmp_path / "fr"
    fr.mkdir()
    for r in (0, 2):
        entries = [make_fr_entry(s) for s in range(1, 11 if r == 0 else 10)]
        (fr / f"nccl_trace_rank_{r}").write_text(json.dumps(make_fr_dump(3, entries)))
    bad = fr / "nccl_trace_rank_1"
    for name, write, must_fail in _fr_variants(random.Random(SEED + 2)):
        write(bad)
        loaded = load_fr(Options(fr_dir=fr))
        problems = [p for p in loaded.problems if p.path == str(bad)]
        assert 1 in loaded.dumps or problems, f"{name}: neither loaded nor a data problem"
        if must_fail:
            assert problems and 1 not in loaded.dumps, f"{name}: should be a data problem"
        rep = diagnose(Options(fr_dir=fr))
        if name.startswith(("json:type:", "json:value:")):
            continue
        blamed = {r for v in rep.verdicts if v.kind.is_fault for r in v.ranks}
        assert blamed <= {2}, f"{name}: blamed {blamed}"


def test_huge_world_size_and_rank_numbers_do_not_hang(tmp_path: Path) -> None:
    """Every file of a job says world_size 10**18, and one file is named rank-10**18: bounded work."""
    job, _ = _job(tmp_path / "a")
    for d in (*job.dumps.values(), *job.metas.values()):
        assert d is not None
        d["world_size"] = 10**18
    job_dir = job.write(tmp_path)
    big = job_dir / "incidents" / job.incident / f"rank-{10**18}.json"
    big.write_text(json.dumps({**job.dumps[1], "rank": 10**18}))
    rep = diagnose(Options(job_dir=job_dir, host_key="not-this-host"))
    assert any(p.path == str(big) and "out of range" in p.problem for p in rep.data_problems)
    assert {r for v in rep.verdicts if v.kind.is_fault for r in v.ranks} <= {3}
