"""Read an incident's dumps on every core: at 16,384+ ranks the summaries, not the stages, are the cost.

The dump files are split into chunks; forked worker processes read and summarize them
(loader's `_load_each`, the same code as the serial path) and send the summaries back
pickled, in chunk order, so the result (dumps, problems, their order) is what the serial
path gives. Forked, so the workers inherit the incident directory's open descriptor and
read nothing by path (untrusted.py). Dumps with inline rank lists (schema 1.x) go back to
the parent to be read there: their lists must be shared through the parent's table
(loader.consensus counts them by identity). Any failure of the pool falls back to the
serial path for whatever is left: this can only be faster, never different.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Callable, Optional

from .fastread import IntListTable, read_document
from .summary import RankDump, dump_from_doc
from .types import DataProblem
from .untrusted import SafeDir

__all__ = ["MIN_FILES", "worker_count", "load_dumps"]

MIN_FILES = 2048  # below this the pool's start-up costs more than it saves
MAX_WORKERS = 8

LoadEach = Callable[..., dict[int, Any]]
_state: Optional[tuple[SafeDir, list[tuple[int, str]], int, LoadEach]] = None  # set in the parent, seen forked


def worker_count(files: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return min(cores, MAX_WORKERS) if files >= MIN_FILES else 1


def _work(span: tuple[int, int]) -> tuple[dict[int, RankDump], list[DataProblem], dict[int, str], list[int]]:
    assert _state is not None
    folder, files, keep, load_each = _state
    table = IntListTable()

    def build(rank: int, path: str, raw: bytes) -> RankDump:
        doc, records, _ = read_document(raw, table, keep)
        return dump_from_doc(doc, records, path, keep)

    problems: list[DataProblem] = []
    unusable: dict[int, str] = {}
    out = load_each(folder, files[span[0]:span[1]], build, problems, lambda: None, unusable)
    inline = [r for r, d in out.items() if any(v.members is not None or v.ring is not None for v in d.comms.values())]
    for r in inline:
        del out[r]
    return out, problems, unusable, inline


def load_dumps(folder: SafeDir, files: list[tuple[int, str]], keep: int, build: Callable[[int, str, bytes], Any],
               problems: list[DataProblem], tick: Callable[[], None], unusable: dict[int, str],
               load_each: LoadEach) -> dict[int, Any]:
    """What `load_each(folder, files, build, problems, tick, unusable)` returns, read by forked workers."""
    global _state
    workers = worker_count(len(files))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return load_each(folder, files, build, problems, tick, unusable)
    step = max(64, -(-len(files) // (workers * 8)))
    spans = [(lo, min(lo + step, len(files))) for lo in range(0, len(files), step)]
    out: dict[int, Any] = {}
    again: list[tuple[int, str]] = []  # read here: inline lists (1.x), or a chunk the pool could not do
    done = 0
    _state = (folder, files, keep, load_each)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for (lo, hi), (part, probs, bad, inline) in zip(spans, pool.imap(_work, spans)):
                out.update(part)
                problems.extend(probs)
                unusable.update(bad)
                back = set(inline)
                again.extend((r, n) for r, n in files[lo:hi] if r in back)
                for _ in range(hi - lo):
                    tick()
                done += 1
    except Exception:  # a pool that cannot start or a worker that died: the rest is read here
        pass
    finally:
        _state = None
    for lo, hi in spans[done:]:
        again.extend(files[lo:hi])
    if again:
        out.update(load_each(folder, again, build, problems, tick, unusable))
    order = {r: i for i, (r, _) in enumerate(files)}
    return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))
