"""Job directory -> `LoadedJob`: rank metadata plus one incident's dumps, streamed.

Layout and schema: docs/dump-schema.md. Each file is read, summarized
(summary.py) and dropped at once, so memory grows with the number of ranks, not
with the number of records. Python's garbage collector is off while loading (the
summaries hold no cycles; collections would rescan millions of young objects) and
back on in a `finally`, whatever happens.

Bad input never raises: a missing, truncated, non-JSON, wrong-schema or too-new
file becomes a `DataProblem` naming the file and what is wrong with it, and a rank
whose dump is there but unusable is noted in `LoadedJob.unusable` (it was alive to
write it: reach.py does not take it for dead). Nothing is read through a symbolic
link or from anything but a regular file (untrusted.py).
"""

from __future__ import annotations

import gc
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Optional, TypeVar

from ..ownership import job_dir_not_ours, untrusted_job_dir_text
from . import parallel
from .fastread import IntListTable, read_document
from .job import MAX_WORLD_SIZE, LoadedJob, OptionsError
from .membership import COMMS_DIR, Membership, comm_file_name, parse_comm_file
from .summary import RankDump, RankMeta, SchemaError, dump_from_doc, meta_from_doc
from .types import DataProblem, Options
from .untrusted import RefusedPath, SafeDir, refusal

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

    Counted by value. Cheaply: the lists are interned (fastread.IntListTable), so 16,384 copies
    of a 16,384-rank ring are mostly one object, counted by identity first; only the distinct
    objects are then compared by value (equal lists read by different tables, workers or files
    are one vote). Ties go to the value seen first.
    """
    by_id: dict[int, T] = {}  # holds every object counted, so no id is reused while counting
    counts: Counter[int] = Counter()
    for v in values:
        by_id[id(v)] = v
        counts[id(v)] += 1
    totals: dict[Hashable, int] = {}
    first: dict[Hashable, T] = {}
    for i, n in counts.items():  # in the order first seen
        v = by_id[i]
        key = _value_key(v)
        totals[key] = totals.get(key, 0) + n
        first.setdefault(key, v)
    if not totals:
        return None
    best = max(totals, key=lambda k: totals[k])  # max keeps the first of equals
    return first[best]


def _value_key(v: object) -> Hashable:
    """What `v` is equal by: lists as tuples (a list and a tuple of the same ranks are one value)."""
    key: Hashable = ("seq", tuple(v)) if isinstance(v, (list, tuple)) else ("one", v)
    try:
        hash(key)
    except TypeError:  # holds something unhashable: equal to itself only
        return ("id", id(v))
    return key


def _rank_files(folder: SafeDir, problems: list[DataProblem], leftovers: bool = True,
                refused: Optional[set[int]] = None) -> list[tuple[int, str]]:
    """(rank, file name) of every regular `rank-<r>.json` in `folder`; links and the like are refused.

    `leftovers`: also report temporary files (not for ranks/, rewritten while a job runs);
    `refused` collects the ranks whose entry was refused.
    """
    out: list[tuple[int, str]] = []
    try:
        entries = folder.entries()
    except OSError as e:
        problems.append(DataProblem(str(folder.path), f"cannot list: {e.strerror or e}"))
        return out
    for name, kind in entries:
        m = RANK_FILE.match(name)
        if m and int(m.group(1)) >= MAX_WORLD_SIZE:
            problems.append(DataProblem(str(folder.path / name), f"rank number out of range (at most "
                                                                 f"{MAX_WORLD_SIZE - 1}): file ignored"))
        elif m and kind == "a regular file":
            out.append((int(m.group(1)), name))
        elif m:
            problems.append(DataProblem(str(folder.path / name), refusal(kind)))
            if refused is not None:
                refused.add(int(m.group(1)))
        elif leftovers and "rank-" in name and (name.startswith(".") or ".tmp" in name or name.endswith("~")):
            problems.append(DataProblem(str(folder.path / name),
                                        "leftover temporary file: its writer stopped before renaming it into place"))
    return out


def _subdir(parent: SafeDir, name: str, problems: Optional[list[DataProblem]]) -> Optional[SafeDir]:
    """`parent/name` entered without following a link; None (and a problem, if refused) otherwise."""
    try:
        return parent.subdir(name)
    except FileNotFoundError:
        return None
    except OSError as e:
        if problems is not None:
            problems.append(DataProblem(str(parent.path / name), e.strerror or str(e)))
        return None


def _incident_names(incidents: SafeDir, problems: Optional[list[DataProblem]]) -> list[str]:
    try:
        entries = incidents.entries()
    except OSError as e:
        if problems is not None:
            problems.append(DataProblem(str(incidents.path), f"cannot list: {e.strerror or e}"))
        return []
    names = []
    for name, kind in entries:
        if kind == "a directory":
            names.append(name)
        elif kind == "a symbolic link" and problems is not None:
            problems.append(DataProblem(str(incidents.path / name), "incident " + refusal(kind, "a directory")))
    return names


def _suspected_only(folder: SafeDir) -> bool:
    """A watchdog suspected this incident early, and it was neither resolved nor confirmed (suspicion.py)."""
    try:
        names = {n for n, _ in folder.entries()}
    except OSError:
        return False
    return "suspected.json" in names and not names & {"resolved.json", "confirmed.json"}


def list_incidents(job_dir: Path) -> list[str]:
    """Incident ids under `job_dir/incidents` (real directories only; links are not incidents)."""
    try:
        with SafeDir.open_root(job_dir) as root:
            inc = _subdir(root, "incidents", None)
            if inc is None:
                return []
            with inc:
                return _incident_names(inc, None)
    except OSError:
        return []


# Incidents dumped within this long of the latest one belong to the same event: one hang
# seen by several watchdogs, each naming the op it was stuck in (a point-to-point op's
# incident is its own rank's), or a failure and the hang behind it.
_SAME_EVENT_NS = 10_000_000_000


def _latest_complete(names: list[str], times: dict[str, Optional[int]], dumps: dict[str, int],
                     suspected: frozenset[str] = frozenset()) -> str:
    """Of the incidents of the latest event, the one with the most rank dumps (then the latest):
    the one every rank it reached dumped into, not one that only a few ranks shared. An incident
    a watchdog only suspected (suspicion.py) yields to another of the same event: the failure its
    op then met (an error incident) says more than the early dump did."""
    latest = max((t for t in times.values() if t is not None), default=None)
    recent = [n for n in names
              if latest is None or ((t := times[n]) is not None and latest - t <= _SAME_EVENT_NS)]
    return max(recent or names, key=lambda n: (n not in suspected, dumps[n], times[n] is not None, times[n] or 0, n))


# A failure's incident is named by the op that failed (error-c<comm>-s<seq>). The two ends
# of a broken link can fail at neighbouring ops (one finished op N, the other was still in
# it), so each dumps into its own incident, and when the break also cuts the side channel
# neither reaches the other's: each incident holds one of the two dumps. Such a dump is the
# same failure seen from the other end; without it the diagnosis takes the other end for
# silent (unresponsive or dead).
_ERROR_COMM = re.compile(r"error-c(\d+)-")


def _time_of(name: str, incidents_dir: SafeDir, times: dict[str, Optional[int]]) -> Optional[int]:
    """An incident's time (its latest dump's), read once and kept in `times`."""
    if name not in times:
        sub = _subdir(incidents_dir, name, None)
        times[name] = None
        if sub is not None:
            with sub:
                times[name] = _incident_time(sub)
    return times[name]


def _same_event(chosen: Optional[str], names: list[str], incidents_dir: SafeDir,
                times: dict[str, Optional[int]], prefix: str = "") -> list[str]:
    """Other incidents (named `prefix`...) of the chosen one's event, nearest in time first."""
    at = _time_of(chosen or "", incidents_dir, times) if chosen else None
    if at is None:
        return []
    near = [(abs(t - at), n) for n in names if n != chosen and n.startswith(prefix)
            and (t := _time_of(n, incidents_dir, times)) is not None and abs(t - at) <= _SAME_EVENT_NS]
    return [n for _, n in sorted(near)]


def _sibling_errors(chosen: Optional[str], names: list[str], incidents_dir: SafeDir,
                    times: dict[str, Optional[int]]) -> list[str]:
    """Other error incidents of the chosen one's communicator, of the same event, nearest in time first."""
    m = _ERROR_COMM.match(chosen or "")
    return _same_event(chosen, names, incidents_dir, times, m.group(0)) if m is not None else []


def _incident_time(folder: SafeDir) -> Optional[int]:
    best: Optional[int] = None
    for _, name in _rank_files(folder, []):
        try:
            head = folder.read(name, _HEAD_BYTES)
            m = _TIME_NS.search(head)
            if m is None and len(head) == _HEAD_BYTES:
                m = _TIME_NS.search(folder.read(name))
        except OSError:
            continue
        if m is not None:
            t = int(m.group(1))
            best = t if best is None or t > best else best
    return best


def incident_time_ns(folder: Path) -> Optional[int]:
    """Max `time_ns` over the incident's dumps (read from each file's head, not parsed)."""
    folder = Path(folder)
    try:
        with SafeDir.open_root(folder.parent) as parent:
            inc = _subdir(parent, folder.name, None)
            if inc is None:
                return None
            with inc:
                return _incident_time(inc)
    except OSError:
        return None


def _read(folder: SafeDir, name: str, problems: list[DataProblem]) -> Optional[bytes]:
    try:
        return folder.read(name)
    except OSError as e:
        problems.append(DataProblem(str(folder.path / name), f"cannot read: {e.strerror or e}"
                                    if not isinstance(e, RefusedPath) else e.strerror or str(e)))
        return None


def _load_each(folder: SafeDir, files: list[tuple[int, str]], build: Callable[[int, str, bytes], Any],
               problems: list[DataProblem], tick: Callable[[], None],
               unusable: Optional[dict[int, str]] = None) -> dict[int, Any]:
    """Build each file; a file that is there but cannot be used is a problem (and, if asked, noted per rank)."""
    out: dict[int, Any] = {}
    base = str(folder.path) + os.sep  # not Path / name per file: at 65,536 files the joins show in a profile
    for rank, name in files:
        path = base + name
        before = len(problems)
        raw = _read(folder, name, problems)
        tick()
        if raw is not None:
            try:
                item = build(rank, path, raw)
            except SchemaError as e:
                problems.append(DataProblem(path, str(e)))
            except ValueError as e:
                problems.append(DataProblem(path, describe_json_error(e, len(raw))))
            except (RecursionError, MemoryError) as e:
                problems.append(DataProblem(path, f"cannot be read: {type(e).__name__} (nested too deeply or too "
                                                  f"large)"))
            except Exception as e:  # a file must never take the diagnosis down: it is a data problem
                problems.append(DataProblem(path, f"cannot be used: {type(e).__name__}: {e}"))
            else:
                if item.rank == rank:
                    out[rank] = item
                    continue
                problems.append(DataProblem(path, f"the file name says rank {rank} but the document says rank "
                                                  f"{item.rank}: file ignored"))
        if unusable is not None and len(problems) > before:
            unusable[rank] = problems[-1].problem
    return out


def load_job(options: Options) -> LoadedJob:
    """Read `options.job_dir`: metadata of every rank and the chosen incident's dumps."""
    assert options.job_dir is not None
    job_dir = Path(options.job_dir)
    job = LoadedJob(job=options.job or job_dir.name, source="hetobs", root=job_dir)
    try:
        root = SafeDir.open_root(job_dir)
    except OSError as e:
        job.problems.append(DataProblem(str(job_dir), "job directory does not exist" if not job_dir.exists()
                                        else f"cannot open: {e.strerror or e}"))
        return job
    with root:
        why = None if options.trust_dir else job_dir_not_ours(os.fstat(root.fd))
        if why:
            job.problems.append(DataProblem(str(job_dir), untrusted_job_dir_text(why)))
            return job
        resolved = _load_into(job, root, options)
    _check_consistency(job, job_dir)
    _settle_comms(job, resolved)
    return job


_MembershipRefs = dict[tuple[Any, str], list[int]]


def _membership_refs(job: LoadedJob) -> _MembershipRefs:
    """(comm, hash) -> the ranks whose dump or metadata refers to that membership file."""
    refs: _MembershipRefs = {}
    for r, d in job.dumps.items():
        for c, view in d.comms.items():
            if view.membership_hash is not None:
                refs.setdefault((c, view.membership_hash), []).append(r)
    for r, m in job.metas.items():
        for c, h in m.membership_hashes.items():
            refs.setdefault((c, h), []).append(r)
    return refs


def _read_memberships(job: LoadedJob, root: SafeDir) -> dict[tuple[Any, str], Membership]:
    """Each membership file the ranks refer to, checked against its hash; a missing or wrong one is a
    data problem (the comm's members then come from the ranks' own comm ranks, and its ring is unknown)."""
    refs = _membership_refs(job)
    out: dict[tuple[Any, str], Membership] = {}
    if not refs:
        return out
    folder = _subdir(root, COMMS_DIR, job.problems)
    try:
        for (comm, digest), ranks in sorted(refs.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            name = comm_file_name(comm, digest)
            path = str(root.path / COMMS_DIR / name)
            why, raw = None, b""
            try:
                if folder is None:
                    raise FileNotFoundError
                raw = folder.read(name)
                out[(comm, digest)] = parse_comm_file(raw, comm, digest)
            except FileNotFoundError:
                why = "missing (its lowest rank writes it at start)"
            except RefusedPath as e:
                why = e.strerror or str(e)
            except OSError as e:
                why = f"cannot read: {e.strerror or e}"
            except SchemaError as e:
                why = str(e)
            except ValueError as e:
                why = describe_json_error(e, len(raw))
            if why is not None:
                job.problems.append(DataProblem(path, f"membership of comm {comm} (referred to by rank(s) "
                                                      f"{rank_ranges(ranks)}): {why}; its members are taken from "
                                                      f"the ranks' own comm ranks and its ring is not walked"))
    finally:
        if folder is not None:
            folder.close()
    return out


def _load_into(job: LoadedJob, root: SafeDir, options: Options) -> dict[tuple[Any, str], Membership]:
    table = IntListTable()
    ranks_dir = _subdir(root, "ranks", job.problems)
    meta_files = _rank_files(ranks_dir, job.problems, leftovers=False) if ranks_dir is not None else []
    incidents_dir = _subdir(root, "incidents", job.problems)
    try:
        _load_incident(job, root, ranks_dir, meta_files, incidents_dir, table, options)
    finally:
        for d in (ranks_dir, incidents_dir):
            if d is not None:
                d.close()
    return _read_memberships(job, root)


def _load_incident(job: LoadedJob, root: SafeDir, ranks_dir: Optional[SafeDir], meta_files: list[tuple[int, str]],
                   incidents_dir: Optional[SafeDir], table: IntListTable, options: Options) -> None:
    job.incidents = _incident_names(incidents_dir, job.problems) if incidents_dir is not None else []
    chosen: Optional[str] = options.incident
    if chosen is not None and chosen not in job.incidents:
        have = ", ".join(job.incidents) or "none"
        raise OptionsError(f"incident {chosen!r} not found under {root.path / 'incidents'} (have: {have})")
    times: dict[str, Optional[int]] = {}
    if chosen is None and len(job.incidents) == 1:
        chosen = job.incidents[0]
    elif chosen is None and job.incidents:
        assert incidents_dir is not None
        dumps: dict[str, int] = {}
        suspected: set[str] = set()
        for name in job.incidents:
            sub = _subdir(incidents_dir, name, None)
            times[name], dumps[name] = None, 0
            if sub is not None:
                with sub:
                    times[name] = _incident_time(sub)
                    dumps[name] = len(_rank_files(sub, []))
                    if _suspected_only(sub):
                        suspected.add(name)
        chosen = _latest_complete(job.incidents, times, dumps, frozenset(suspected))
    job.incident = chosen
    incident_dir = _subdir(incidents_dir, chosen, job.problems) if chosen and incidents_dir is not None else None
    refused: set[int] = set()
    dump_files = _rank_files(incident_dir, job.problems, refused=refused) if incident_dir is not None else []
    for r in refused:
        job.unusable.setdefault(r, "its dump file was refused (not a regular file)")

    job.meta_ranks = {r for r, _ in meta_files}
    total = len(dump_files)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if options.progress is not None and (done % 256 == 0 or done == total):
            options.progress(done, total)

    keep = max(1, options.tail_entries)

    def build_meta(rank: int, path: str, raw: bytes) -> RankMeta:
        doc, _, _ = read_document(raw, table, 0)
        return meta_from_doc(doc, path)

    def build_dump(rank: int, path: str, raw: bytes) -> RankDump:
        doc, records, _ = read_document(raw, table, keep)
        return dump_from_doc(doc, records, path, keep)

    try:
        with paused_gc():
            if incident_dir is not None:
                job.dumps = parallel.load_dumps(incident_dir, dump_files, keep, build_dump, job.problems, tick,
                                                job.unusable, _load_each, job.notes)
            # A dump carries its rank's host, pid and rings; metadata is only needed for the
            # ranks that left none (and for all when there is no incident). At 16,384 ranks
            # this skips parsing 16,384 more copies of the ring.
            wanted = [(r, p) for r, p in meta_files if r not in job.dumps] if job.dumps else meta_files
            total += len(wanted)
            if ranks_dir is not None:
                job.metas = _load_each(ranks_dir, wanted, build_meta, job.problems, tick)
            if incident_dir is not None and incidents_dir is not None:
                _borrow_sibling_dumps(job, incidents_dir, times, build_dump, tick)
                _merge_same_hang(job, incidents_dir, times, build_dump, tick)
            if ranks_dir is not None:
                _load_host_metas(job, ranks_dir, meta_files, build_meta, tick)
    finally:
        if incident_dir is not None:
            incident_dir.close()

    if not meta_files:
        job.problems.append(DataProblem(str(root.path / "ranks"), "no rank metadata (ranks/rank-<r>.json): hosts, "
                                                                  "pids and clean exits are unknown; judging from "
                                                                  "dumps alone"))
    if job.dumps:
        ts = [d.time_ns for d in job.dumps.values() if d.time_ns]
        job.incident_time_ns = max(ts) if ts else times.get(chosen or "")


def _borrow_sibling_dumps(job: LoadedJob, incidents_dir: SafeDir, times: dict[str, Optional[int]],
                          build_dump: Callable[[int, str, bytes], RankDump], tick: Callable[[], None]) -> None:
    """Give a rank with no dump in the chosen error incident its dump from a sibling (_ERROR_COMM)."""
    ws = job.world_size
    if not ws:
        return
    missing = {r for r in range(ws) if r not in job.dumps and r not in job.unusable}
    for name in _sibling_errors(job.incident, job.incidents, incidents_dir, times) if missing else []:
        sub = _subdir(incidents_dir, name, job.problems)
        if sub is None:
            continue
        with sub:
            files = [(r, f) for r, f in _rank_files(sub, []) if r in missing]
            got = _load_each(sub, files, build_dump, job.problems, tick) if files else {}
        for r, d in got.items():
            if d.reason != "error":
                continue  # only a failure's own dump is the same failure seen from the other end
            job.dumps[r] = d
            job.borrowed[r] = name
            missing.discard(r)
        if not missing:
            break
    by_incident: dict[str, list[int]] = {}
    for r, name in job.borrowed.items():
        by_incident.setdefault(name, []).append(r)
    for name, rs in sorted(by_incident.items()):
        job.notes.append(f"rank(s) {rank_ranges(sorted(rs))} left no dump in {job.incident} but failed at a "
                         f"neighbouring op of the same communicator: their dump from {name} is used")


_REQUESTED_BY = re.compile(rb'"requested_by"\s*:\s*(\d+)')


def _hang_span(job: LoadedJob) -> Optional[tuple[int, int]]:
    """(earliest last progress, latest dump time) of the chosen incident's dumps: the hang as they saw it."""
    progress = [d.last_progress_ns for d in job.dumps.values() if d.last_progress_ns]
    times = [d.time_ns for d in job.dumps.values() if d.time_ns]
    return (min(progress), max(times)) if progress and times else None


def _of_the_hang(d: RankDump, span: tuple[int, int]) -> bool:
    """Dumped while the hang lasted, and no progress since the chosen incident's dumps: the same hang."""
    start, end = span
    return d.time_ns is not None and d.last_progress_ns is not None and d.time_ns >= start and \
        d.last_progress_ns <= end


def _merge_same_hang(job: LoadedJob, incidents_dir: SafeDir, times: dict[str, Optional[int]],
                     build_dump: Callable[[int, str, bytes], RankDump], tick: Callable[[], None]) -> None:
    """One hang, several incidents: give a rank with no dump in the chosen one its dump from another.

    The ranks of one hang dump into several incidents: each watchdog names the op it is
    stuck in (a relay's p2p incident is its own rank's, a collective's is named by its op),
    an on-demand dump has its own, and where the network is cut each side's requests never
    reach the other. A rank that dumped into any incident of the same event while the hang
    lasted (`_of_the_hang`) was alive in it, and its dump says where it was. A rank that asked
    for dumps in the hang (the `requested_by` of a dump) was alive too, though its own dump may
    still be on its way (it waits for the peers it asked): noted in `job.alive_in_hang`.
    """
    ws = job.world_size
    span = _hang_span(job)
    if not ws or span is None:
        return
    # A rank that exited cleanly is judged by its exit, as before (reach.py), not by an earlier dump.
    missing = {r for r in range(ws) if r not in job.dumps and r not in job.unusable
               and not (r in job.metas and job.metas[r].exited_cleanly)}
    merged: dict[str, list[int]] = {}
    for d in list(job.dumps.values()):
        _note_requester(job, d.requested_by, missing, d.rank, job.incident or "", d.time_ns, span)
    for name in _same_event(job.incident, job.incidents, incidents_dir, times) if missing else []:
        sub = _subdir(incidents_dir, name, job.problems)
        if sub is None:
            continue
        with sub:
            files = _rank_files(sub, [])
            got = _load_each(sub, [(r, f) for r, f in files if r in missing], build_dump, job.problems, tick)
            for r, d in got.items():
                if _of_the_hang(d, span):
                    job.dumps[r] = d
                    job.borrowed[r] = name
                    merged.setdefault(name, []).append(r)
                    missing.discard(r)
                    job.alive_in_hang.pop(r, None)
            for r, f in files if missing else ():
                try:
                    head = sub.read(f, _HEAD_BYTES)
                except OSError:
                    continue
                t, by = _TIME_NS.search(head), _REQUESTED_BY.search(head)
                if t is not None and by is not None:
                    _note_requester(job, int(by.group(1)), missing, r, name, int(t.group(1)), span)
        if not missing:
            break
    for name, rs in sorted(merged.items()):
        job.notes.append(f"rank(s) {rank_ranges(sorted(rs))} left no dump in {job.incident} but dumped into {name} "
                         f"during the same hang (no progress since): their dump from {name} is used")


def _note_requester(job: LoadedJob, requester: Optional[int], missing: set[int], rank: int, incident: str,
                    time_ns: Optional[int], span: tuple[int, int]) -> None:
    if requester is None or requester not in missing or requester in job.alive_in_hang or time_ns is None \
            or time_ns < span[0]:
        return
    job.alive_in_hang[requester] = (f"rank {requester} asked for dumps during the hang: rank {rank}'s dump in "
                                    f"incident {incident} was requested by it, so it was alive then (its own dump "
                                    f"waits on the peers it asked)")


def _load_host_metas(job: LoadedJob, ranks_dir: SafeDir, meta_files: list[tuple[int, str]],
                     build_meta: Callable[[int, str, bytes], RankMeta], tick: Callable[[], None]) -> None:
    """Metadata of the dumped ranks that share a host name with a rank that left none.

    Which ranks share a host (a machine, a network namespace) is its rank file's `host_key`:
    a host name alone may repeat (containers, namespaces). Only these few are read, so a
    whole host without dumps can be told from one missing rank on a host with others."""
    names = {m.host for r, m in job.metas.items()
             if r not in job.dumps and r not in job.unusable and not m.exited_cleanly and m.host}
    wanted = [(r, f) for r, f in meta_files
              if r in job.dumps and r not in job.metas and job.dumps[r].host in names]
    if wanted:
        job.metas.update(_load_each(ranks_dir, wanted, build_meta, job.problems, tick))


def _check_consistency(job: LoadedJob, job_dir: Path) -> None:
    ws = job.world_size
    if ws and job.meta_ranks:
        missing = [r for r in range(ws) if r not in job.meta_ranks]
        if missing:
            job.problems.append(DataProblem(str(job_dir / "ranks"),
                                            f"missing metadata of rank(s) {rank_ranges(missing)} "
                                            f"(world size {ws})"))
    if ws and job.incident:
        # unusable files are data problems of their own, listed by path
        missing = [r for r in range(ws) if r not in job.dumps and r not in job.unusable]
        if missing:
            job.problems.append(DataProblem(str(job_dir / "incidents" / job.incident),
                                            f"no dump from rank(s) {rank_ranges(missing)} (world size {ws})"))
    for r, d in job.dumps.items():
        if d.incident and job.incident and d.incident != job.incident and d.incident != job.borrowed.get(r):
            job.problems.append(DataProblem(d.path, f"dump says incident {d.incident!r} but lies in "
                                                    f"{job.incident!r}: used as part of {job.incident!r}"))


def _settle_comms(job: LoadedJob, resolved: Optional[dict[tuple[Any, str], Membership]] = None) -> None:
    """Membership and ring per communicator by consensus over every rank's report.

    A rank's report is its inline lists (1.x) or the checked membership file its hash names
    (2.x; one shared tuple per file, so consensus counts it once per referring rank)."""
    resolved = resolved or {}
    _fill_views(job, resolved)
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
    _members_from_positions(job)


def _fill_views(job: LoadedJob, resolved: dict[tuple[Any, str], Membership]) -> None:
    """Give 2.x views and metadata the lists of their checked membership file, as 1.x files had them inline."""
    if not resolved:
        return
    for d in job.dumps.values():
        for c, view in d.comms.items():
            ms = resolved.get((c, view.membership_hash)) if view.membership_hash is not None else None
            if ms is not None:
                view.members, view.ring = ms.members, ms.ring
    for m in job.metas.values():
        for c, h in m.membership_hashes.items():
            ms = resolved.get((c, h))
            if ms is not None:
                m.members[c], m.rings[c] = ms.members, ms.ring


def _members_from_positions(job: LoadedJob) -> None:
    """Comms referred to by hash whose file could not be used: members from each rank's own comm rank.

    Complete (every comm rank 0..size-1 claimed by exactly one rank) gives the list in comm-rank
    order; otherwise the ranks known to be members, sorted, so no rank outside is taken for one.
    The ring stays unknown: only the file says it."""
    pos: dict[Any, dict[int, set[int]]] = {}
    sizes: dict[Any, list[int]] = {}

    def note(comm: Any, rank: int, comm_rank: Optional[int], size: Optional[int]) -> None:
        if comm in job.members:
            return
        pos.setdefault(comm, {}).setdefault(comm_rank if comm_rank is not None else -1, set()).add(rank)
        if size is not None:
            sizes.setdefault(comm, []).append(size)

    for r, d in job.dumps.items():
        for c, view in d.comms.items():
            if view.membership_hash is not None:
                note(c, r, view.comm_rank, view.size)
    for r, m in job.metas.items():
        for c in m.membership_hashes:
            note(c, r, m.comm_ranks.get(c), m.comm_sizes.get(c))
    for c, by_pos in pos.items():
        size = Counter(sizes[c]).most_common(1)[0][0] if c in sizes else None
        known = {r for rs in by_pos.values() for r in rs}
        if size is not None and sorted(by_pos) == list(range(size)) and all(len(rs) == 1 for rs in by_pos.values()):
            job.members[c] = tuple(next(iter(by_pos[i])) for i in range(size))
        else:
            job.members[c] = tuple(sorted(known))
