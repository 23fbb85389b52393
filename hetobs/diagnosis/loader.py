"""Job directory -> `LoadedJob`: rank metadata plus one incident's dumps, streamed.

Layout and schema: docs/dump-schema.md. Each file is read, summarized
(summary.py) and dropped at once, so memory grows with the number of ranks, not
with the number of records. Python's garbage collector is off while loading (the
summaries hold no cycles; collections would rescan millions of young objects) and
back on in a `finally`, whatever happens.

Bad input never raises: a missing, truncated, non-JSON, wrong-schema or too-new
file becomes a `DataProblem` naming the file and what is wrong with it.
"""

from __future__ import annotations

import gc
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar

from .fastread import IntListTable, read_document
from .job import LoadedJob, OptionsError
from .summary import RankDump, RankMeta, SchemaError, dump_from_doc, meta_from_doc
from .types import DataProblem, Options

__all__ = ["load_job", "list_incidents", "incident_time_ns", "describe_json_error", "rank_ranges", "paused_gc",
           "consensus"]

RANK_FILE = re.compile(r"^rank-(\d+)\.json$")
_TIME_NS = re.compile(rb'"time_ns"\s*:\s*(\d+)')
_HEAD_BYTES = 65536
T = TypeVar("T")


class paused_gc:
    """Context manager: garbage collector off inside, restored (if it was on) on the way out."""

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            gc.enable()


def describe_json_error(e: ValueError, size: int) -> str:
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte {e.start}): not a JSON dump"
    if isinstance(e, json.JSONDecodeError):
        if size == 0:
            return "empty file (truncated: the writer stopped before writing anything)"
        if e.pos >= size - 2 or e.msg.startswith("Unterminated") or "Expecting" in e.msg and e.pos >= size - 64:
            return f"truncated JSON: the document ends at byte {size} before it is complete ({e.msg})"
        return f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
    return f"not valid JSON: {e}"


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5" (problem lists stay short at 16,384 ranks)."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def consensus(values: Iterable[T]) -> Optional[T]:
    """The value most ranks report (membership, ring): no single rank is the reference.

    Counted by identity: the lists are interned (fastread.IntListTable), so equal lists
    are one object and 16,384 copies of a 16,384-rank ring are not hashed 16,384 times.
    """
    by_id: dict[int, T] = {}
    counts: Counter[int] = Counter()
    for v in values:
        by_id[id(v)] = v
        counts[id(v)] += 1
    if not counts:
        return None
    return by_id[counts.most_common(1)[0][0]]


def _rank_files(folder: Path, problems: list[DataProblem]) -> list[tuple[int, Path]]:
    out: list[tuple[int, Path]] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        problems.append(DataProblem(str(folder), f"cannot list: {e.strerror or e}"))
        return out
    for name in names:
        m = RANK_FILE.match(name)
        if m:
            out.append((int(m.group(1)), folder / name))
        elif "rank-" in name and (name.startswith(".") or ".tmp" in name or name.endswith("~")):
            problems.append(DataProblem(str(folder / name),
                                        "leftover temporary file: its writer stopped before renaming it into place"))
    return out


def list_incidents(job_dir: Path) -> list[str]:
    try:
        return sorted(p.name for p in (job_dir / "incidents").iterdir() if p.is_dir())
    except OSError:
        return []


def incident_time_ns(folder: Path) -> Optional[int]:
    """Max `time_ns` over the incident's dumps (read from each file's head, not parsed)."""
    best: Optional[int] = None
    for _, path in _rank_files(folder, []):
        try:
            with open(path, "rb") as f:
                head = f.read(_HEAD_BYTES)
                m = _TIME_NS.search(head)
                if m is None and len(head) == _HEAD_BYTES:
                    m = _TIME_NS.search(head + f.read())
        except OSError:
            continue
        if m is not None:
            t = int(m.group(1))
            best = t if best is None or t > best else best
    return best


def _read(path: Path, problems: list[DataProblem]) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        problems.append(DataProblem(str(path), f"cannot read: {e.strerror or e}"))
        return None


def _load_each(files: list[tuple[int, Path]], build: Callable[[int, Path, bytes], Any],
               problems: list[DataProblem], tick: Callable[[], None]) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for rank, path in files:
        raw = _read(path, problems)
        tick()
        if raw is None:
            continue
        try:
            item = build(rank, path, raw)
        except SchemaError as e:
            problems.append(DataProblem(str(path), str(e)))
            continue
        except ValueError as e:
            problems.append(DataProblem(str(path), describe_json_error(e, len(raw))))
            continue
        if item.rank != rank:
            problems.append(DataProblem(str(path), f"the file name says rank {rank} but the document says rank "
                                                   f"{item.rank}: file ignored"))
            continue
        out[rank] = item
    return out


def load_job(options: Options) -> LoadedJob:
    """Read `options.job_dir`: metadata of every rank and the chosen incident's dumps."""
    assert options.job_dir is not None
    job_dir = Path(options.job_dir)
    job = LoadedJob(job=options.job or job_dir.name, source="hetobs", root=job_dir)
    if not job_dir.is_dir():
        job.problems.append(DataProblem(str(job_dir), "job directory does not exist" if not job_dir.exists()
                                        else "not a directory"))
        return job
    table = IntListTable()
    ranks_dir = job_dir / "ranks"
    meta_files = _rank_files(ranks_dir, []) if ranks_dir.is_dir() else []

    job.incidents = list_incidents(job_dir)
    chosen: Optional[str] = options.incident
    if chosen is not None and chosen not in job.incidents:
        have = ", ".join(job.incidents) or "none"
        raise OptionsError(f"incident {chosen!r} not found under {job_dir / 'incidents'} (have: {have})")
    times: dict[str, Optional[int]] = {}
    if chosen is None and len(job.incidents) == 1:
        chosen = job.incidents[0]
    elif chosen is None and job.incidents:
        times = {name: incident_time_ns(job_dir / "incidents" / name) for name in job.incidents}
        chosen = max(job.incidents, key=lambda n: (times[n] is not None, times[n] or 0, n))
    job.incident = chosen
    dump_files = _rank_files(job_dir / "incidents" / chosen, job.problems) if chosen else []

    job.meta_ranks = {r for r, _ in meta_files}
    total = len(dump_files)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if options.progress is not None and (done % 256 == 0 or done == total):
            options.progress(done, total)

    keep = max(1, options.tail_entries)

    def build_meta(rank: int, path: Path, raw: bytes) -> RankMeta:
        doc, _, _ = read_document(raw, table, 0)
        return meta_from_doc(doc, str(path))

    def build_dump(rank: int, path: Path, raw: bytes) -> RankDump:
        doc, records, _ = read_document(raw, table, keep)
        return dump_from_doc(doc, records, str(path), keep)

    with paused_gc():
        job.dumps = _load_each(dump_files, build_dump, job.problems, tick)
        # A dump carries its rank's host, pid and rings; metadata is only needed for the
        # ranks that left none (and for all when there is no incident). At 16,384 ranks
        # this skips parsing 16,384 more copies of the ring.
        wanted = [(r, p) for r, p in meta_files if r not in job.dumps] if job.dumps else meta_files
        total += len(wanted)
        job.metas = _load_each(wanted, build_meta, job.problems, tick)

    if not meta_files:
        job.problems.append(DataProblem(str(ranks_dir), "no rank metadata (ranks/rank-<r>.json): hosts, pids and "
                                                        "clean exits are unknown; judging from dumps alone"))
    _check_consistency(job, job_dir)
    _settle_comms(job)
    if job.dumps:
        ts = [d.time_ns for d in job.dumps.values() if d.time_ns]
        job.incident_time_ns = max(ts) if ts else times.get(chosen or "")
    return job


def _check_consistency(job: LoadedJob, job_dir: Path) -> None:
    ws = job.world_size
    if ws and job.meta_ranks:
        missing = [r for r in range(ws) if r not in job.meta_ranks]
        if missing:
            job.problems.append(DataProblem(str(job_dir / "ranks"),
                                            f"missing metadata of rank(s) {rank_ranges(missing)} "
                                            f"(world size {ws})"))
    if ws and job.incident:
        missing = [r for r in range(ws) if r not in job.dumps]
        if missing:
            job.problems.append(DataProblem(str(job_dir / "incidents" / job.incident),
                                            f"no dump from rank(s) {rank_ranges(missing)} (world size {ws})"))
    for d in job.dumps.values():
        if d.incident and job.incident and d.incident != job.incident:
            job.problems.append(DataProblem(d.path, f"dump says incident {d.incident!r} but lies in "
                                                    f"{job.incident!r}: used as part of {job.incident!r}"))


def _settle_comms(job: LoadedJob) -> None:
    """Membership and ring per communicator by consensus over every rank's report."""
    members: dict[Any, list[tuple[int, ...]]] = {}
    rings: dict[Any, list[tuple[int, ...]]] = {}
    for m in job.metas.values():
        for c, v in m.members.items():
            members.setdefault(c, []).append(v)
        for c, v in m.rings.items():
            rings.setdefault(c, []).append(v)
    for d in job.dumps.values():
        for c, view in d.comms.items():
            if view.members:
                members.setdefault(c, []).append(view.members)
            if view.ring:
                rings.setdefault(c, []).append(view.ring)
    for c, vs in members.items():
        job.members[c] = consensus(vs) or ()
    for c, vs in rings.items():
        job.rings[c] = consensus(vs) or ()
