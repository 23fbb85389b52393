"""PyTorch Flight Recorder dumps -> `LoadedJob`, for `hetobs diagnose --fr DIR`.

Reads what `torch._C._distributed_c10d._dump_fr_trace_json()` writes (JSON) and what
`_dump_fr_trace()` writes (a pickle), one file per rank named `<prefix><rank>`.
Top-level keys used: "version", "pg_config" ({pg name: {"name", "desc", "ranks":
"[0, 1]"}}), "entries" (records with "record_id", "pg_id", "process_group" [name,
desc], "collective_seq_id", "p2p_seq_id", "profiling_name" like "nccl:all_reduce",
"input_sizes", "input_dtypes", "state", "time_discovered_started_ns", "frames"...).

Differences from torch's own analyzer, on purpose:
- files are opened as untrusted input (untrusted.py): no symbolic link is followed and
  nothing but regular files is opened; no file, however malformed, raises;
- pickles go through `SafeUnpickler`, which builds only dicts, lists, tuples, str,
  bytes, numbers, bools and None and refuses every class or function reference
  (`find_class`), so a dump cannot run code;
- an empty `pg_config` (Gloo writes `{"": {"ranks": "[]"}}`) is fine: membership is
  then the set of ranks that recorded ops on that process group;
- the rank list string is parsed as JSON once per distinct string, never eval'd;
- Gloo records every op as "scheduled", so states are not trusted: a rank's
  position is the highest sequence id it recorded.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from .fastread import IntListTable, read_document
from .job import LoadedJob
from .loader import consensus, describe_json_error, paused_gc
from .summary import CommView, InFlight, RankDump, rec_from_entry
from .types import DataProblem, Options
from .untrusted import RefusedPath, SafeDir, refusal

__all__ = ["load_fr", "SafeUnpickler", "safe_loads", "UnsafePickleError"]

_TRAILING_RANK = re.compile(r"^(.*?)(\d+)(\.json|\.pkl|\.pickle)?$")


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle references a class or function: refused, nothing was executed."""


class SafeUnpickler(pickle.Unpickler):
    """Builds plain containers and scalars only; any global lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:  # noqa: D401
        raise UnsafePickleError(
            f"refused: the pickle references {module}.{name}; Flight Recorder dumps hold only plain "
            f"dicts, lists, strings and numbers, so this file is not one (or was tampered with)")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused: the pickle uses persistent ids")


def safe_loads(raw: bytes) -> Any:
    return SafeUnpickler(io.BytesIO(raw)).load()


_MAX_DEPTH = 8  # how deep below the named directory dumps are looked for


def _load_files(folder: SafeDir, prefix: Optional[str], problems: list[DataProblem],
                read: Callable[[int, str, bytes], None], progress: Any) -> None:
    """Pick the prefix most files share, then hand each of its files' bytes to `read` (rank, path, raw)."""
    by_prefix: dict[str, list[tuple[int, int, str]]] = {}
    dirs: list[SafeDir] = []
    # Listing first (names only), so the prefix is chosen before any file is read; the
    # directories stay open (by descriptor) until every chosen file is read.
    seen: list[tuple[SafeDir, str]] = []
    try:
        for d, name in _walk(folder, problems, dirs):
            m = _TRAILING_RANK.match(name)
            if m is None or (prefix is not None and m.group(1) != prefix):
                continue
            seen.append((d, name))
            by_prefix.setdefault(m.group(1), []).append((int(m.group(2)), len(seen) - 1, name))
        if not by_prefix:
            return
        best = max(by_prefix, key=lambda p: len(by_prefix[p]))
        for p, files in by_prefix.items():
            if p != best:
                problems.append(DataProblem(str(folder.path), f"{len(files)} file(s) with prefix {p!r} ignored "
                                                              f"(the dumps use prefix {best!r})"))
        chosen = sorted(by_prefix[best])
        for i, (rank, idx, name) in enumerate(chosen, 1):
            if progress is not None and (i % 256 == 0 or i == len(chosen)):
                progress(i, len(chosen))
            d = seen[idx][0]
            path = str(d.path / name)
            try:
                raw = d.read(name)
            except OSError as e:
                problems.append(DataProblem(path, e.strerror or str(e) if isinstance(e, RefusedPath)
                                            else f"cannot read: {e.strerror or e}"))
                continue
            read(rank, path, raw)
    finally:
        for d in dirs:
            d.close()


def _walk(folder: SafeDir, problems: list[DataProblem], dirs: list[SafeDir],
               depth: int = 0) -> Iterator[tuple[SafeDir, str]]:
    """(directory, name) of every regular file below `folder`; links and special files are refused.

    Subdirectories are entered by descriptor and left open (appended to `dirs`) for the reads.
    """
    try:
        entries = folder.entries()
    except OSError as e:
        problems.append(DataProblem(str(folder.path), f"cannot list: {e.strerror or e}"))
        return
    for name, kind in entries:
        if kind == "a regular file":
            yield folder, name
        elif kind == "a directory" and depth < _MAX_DEPTH:
            try:
                sub = folder.subdir(name)
            except OSError as e:
                problems.append(DataProblem(str(folder.path / name), e.strerror or str(e)))
                continue
            dirs.append(sub)
            yield from _walk(sub, problems, dirs, depth + 1)
        elif kind != "a directory" and _TRAILING_RANK.match(name):
            problems.append(DataProblem(str(folder.path / name), refusal(kind)))


def _parse_ranks(text: Any, table: IntListTable) -> tuple[int, ...]:
    if isinstance(text, (list, tuple)):
        return tuple(x for x in text if isinstance(x, int))
    if not isinstance(text, str):
        return ()
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    if not body.strip():
        return ()
    try:
        return table.intern(body)
    except ValueError:
        return ()


def _pg_name(e: dict[str, Any]) -> Any:
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and pg and isinstance(pg[0], str):
        return pg[0]
    pid = e.get("pg_id")
    return str(pid) if isinstance(pid, int) else None


def _last_frame(e: dict[str, Any]) -> Optional[str]:
    frames = e.get("frames")
    if not isinstance(frames, list):
        return None
    # innermost user frame: skip torch's own wrappers
    for f in frames:
        if isinstance(f, dict) and isinstance(f.get("filename"), str) and "/torch/" not in f["filename"]:
            return f"{f.get('name')} at {f['filename'].rsplit('/', 1)[-1]}:{f.get('line')}"
    return None


def _dump_from_fr(doc: dict[str, Any], records: list[dict[str, Any]], rank: int, path: str,
                  table: IntListTable, keep: int) -> RankDump:
    if "entries" not in doc and not records and "version" not in doc:
        raise ValueError("no 'version' or 'entries': not a Flight Recorder dump")
    d = RankDump(rank=rank, path=path, reason="flight_recorder", host=None)
    raw_pgs = doc.get("pg_config")
    pg_config: dict[str, Any] = raw_pgs if isinstance(raw_pgs, dict) else {}
    for name, cfg in pg_config.items():
        if not isinstance(cfg, dict):
            continue
        members = _parse_ranks(cfg.get("ranks"), table)
        if name and members:
            d.comms[name] = CommView(comm=name, size=len(members), members=members)
    last_frame: Optional[str] = None
    for e in records:
        if not isinstance(e, dict):
            continue
        name = _pg_name(e)
        if name is None:
            continue
        view = d.comms.get(name)
        if view is None:
            view = d.comms[name] = CommView(comm=name)
        rec = rec_from_entry(e)
        if e.get("is_p2p") is True and rec.seq:
            rec = rec._replace(p2p_seq=rec.p2p_seq or rec.seq, seq=0)
        view.recent.append(rec)
        last_frame = _last_frame(e) or last_frame
    for view in d.comms.values():
        if len(view.recent) > keep:
            del view.recent[:-keep]
        colls = [r for r in view.recent if r.seq]
        if colls:
            view.last_seq = colls[-1].seq
            last = colls[-1]
            if last.state in ("scheduled", "started"):
                view.in_flight = InFlight(last, None, None, ())
    d.where = last_frame
    return d


def load_fr(options: Options) -> LoadedJob:
    """Read every Flight Recorder dump under `options.fr_dir` (JSON or pickle, per file)."""
    assert options.fr_dir is not None
    folder = Path(options.fr_dir)
    job = LoadedJob(job=options.job or folder.name, source="flight_recorder", root=folder,
                    incident=folder.name)
    try:
        root = SafeDir.open_root(folder)
    except OSError as e:
        job.problems.append(DataProblem(str(folder), "directory does not exist" if not folder.exists()
                                        else f"cannot open: {e.strerror or e}"))
        return job
    table = IntListTable()
    keep = max(1, options.tail_entries)
    versions: dict[str, int] = {}

    def read(rank: int, path: str, raw: bytes) -> None:
        if rank in job.dumps:
            job.problems.append(DataProblem(path, f"a second dump for rank {rank}: ignored"))
            return
        problem = _read_one(job, rank, path, raw, table, keep, versions)
        if problem is not None:
            job.problems.append(DataProblem(path, problem))

    with root, paused_gc():
        _load_files(root, options.fr_prefix, job.problems, read, options.progress)
    if not job.dumps and not any(p.path != str(folder) for p in job.problems):
        job.problems.append(DataProblem(str(folder), "no Flight Recorder dumps (files named <prefix><rank>)"))
        return job
    if len(versions) > 1:
        job.notes.append("Flight Recorder dumps of different versions: " +
                         ", ".join(f"{v} ({n} files)" for v, n in sorted(versions.items())))
    _settle(job)
    return job


def _read_one(job: LoadedJob, rank: int, path: str, raw: bytes, table: IntListTable, keep: int,
              versions: dict[str, int]) -> Optional[str]:
    """Parse one file into job.dumps[rank]; what is wrong with it, if anything (never raises)."""
    try:
        if raw[:1] == b"\x80":
            doc = safe_loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("pickle does not hold a dict: not a Flight Recorder dump")
            entries = doc.pop("entries", [])
            records = entries[-keep:] if isinstance(entries, list) else []
        else:
            doc, records, _ = read_document(raw, table, keep)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object: not a Flight Recorder dump")
        job.dumps[rank] = _dump_from_fr(doc, records, rank, path, table, keep)
        v = str(doc.get("version"))
        versions[v] = versions.get(v, 0) + 1
        return None
    except pickle.UnpicklingError as e:
        return str(e) if isinstance(e, UnsafePickleError) else f"not a valid pickle: {e}"
    except (EOFError, IndexError, TypeError, KeyError, AttributeError) as e:
        return f"truncated or corrupt pickle: {type(e).__name__}: {e}" if raw[:1] == b"\x80" else \
            f"not a usable Flight Recorder dump: {type(e).__name__}: {e}"
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return describe_json_error(e, len(raw))
    except ValueError as e:
        return str(e)
    except (RecursionError, MemoryError, OverflowError) as e:
        return f"cannot be read: {type(e).__name__} (nested too deeply or too large)"
    except Exception as e:  # a file must never take the diagnosis down: it is a data problem
        return f"cannot be read: {type(e).__name__}: {e}"


def _settle(job: LoadedJob) -> None:
    """Membership per process group: pg_config by consensus, else who recorded ops on it."""
    cfg: dict[Any, list[tuple[int, ...]]] = {}
    seen: dict[Any, list[int]] = {}
    for d in job.dumps.values():
        for name, view in d.comms.items():
            if view.members:
                cfg.setdefault(name, []).append(view.members)
            if view.recent:
                seen.setdefault(name, []).append(d.rank)
    for name in set(cfg) | set(seen):
        if name in cfg:
            job.members[name] = consensus(cfg[name]) or ()
        else:
            job.members[name] = tuple(sorted(seen[name]))
            job.notes.append(f"process group {name!r}: no membership in pg_config (Gloo); taken as the "
                             f"{len(seen[name])} rank(s) that recorded ops on it")
    for d in job.dumps.values():
        for name, view in d.comms.items():
            view.members = job.members.get(name)
            view.size = len(view.members) if view.members else view.size
