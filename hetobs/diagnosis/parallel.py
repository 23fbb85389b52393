"""Read an incident's dumps on every core: at 16,384+ ranks the summaries, not the stages, are the cost.

The dump files are split into chunks; worker processes read and summarize them (loader's
`_load_each`, the same code as the serial path) and send the summaries back pickled, in chunk
order, so the result (dumps, problems, their order) is what the serial path gives.

Workers are started by a fork server (else spawned), never forked from the diagnosing process:
that process may hold live threads (an on-demand dump request, an exporter), and a fork copies
their locks in whatever state they are. Each worker gets the incident directory as an open
descriptor, duplicated into it as it starts, and reads nothing by path (untrusted.py).

Dumps with inline rank lists (schema 1.x) go back to the parent to be read there, so their
lists are interned in the parent's one table (a 16,384-rank ring is then held once, not once
per chunk). A pool that cannot start or a worker that fails is a note in the report (`failure`),
and whatever it left is read here: the reading is complete either way.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Callable, Optional

from .fastread import IntListTable, read_document
from .summary import RankDump, dump_from_doc
from .types import DataProblem
from .untrusted import SafeDir

__all__ = ["MIN_FILES", "START_METHODS", "PoolFailure", "worker_count", "load_dumps"]

MIN_FILES = 2048  # below this the pool's start-up costs more than it saves
MAX_WORKERS = 8
START_METHODS = ("forkserver", "spawn")  # the first one this platform has; never "fork" (module docstring)

LoadEach = Callable[..., dict[int, Any]]
Chunk = tuple[int, int, list[tuple[int, str]]]  # (lo, hi, files[lo:hi])
ChunkResult = tuple[dict[int, RankDump], list[DataProblem], dict[int, str], list[int]]

_worker: Optional[tuple[SafeDir, int]] = None  # in a worker: the incident directory and `keep`


@dataclass(frozen=True)
class PoolFailure:
    """Why the workers did not read everything: where it failed, the error, and how many files
    the parent then read itself."""

    stage: str  # "start" (no pool) | "worker" (a chunk's worker failed or died)
    error: str  # "<exception type>: <message>"
    files_read_here: int

    def note(self) -> str:
        return (f"parallel dump reading failed at {self.stage} ({self.error}); {self.files_read_here} dump file(s) "
                f"were read by the diagnosing process instead: the reading is complete, only slower")


def worker_count(files: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return min(cores, MAX_WORKERS) if files >= MIN_FILES else 1


def _context() -> BaseContext:
    have = multiprocessing.get_all_start_methods()
    method = next((m for m in START_METHODS if m in have), None)
    if method is None:
        raise OSError(f"none of the start methods {', '.join(START_METHODS)} is available here")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        # Workers fork from a server that has imported the readers and the program's __main__
        # (as multiprocessing does by default): a worker would otherwise import __main__ itself,
        # and `hetobs diagnose`'s is the whole CLI (0.26 s of CPU per worker). Takes effect
        # while the server is not running yet: it is one per process.
        ctx.set_forkserver_preload(["__main__", __name__])
    return ctx


def _adopt_fd(dup: Any) -> int:
    return int(dup.detach())


class _PassedFd:
    """A descriptor handed to a worker as it starts: pickled while multiprocessing launches the
    worker, which then duplicates it into the child (pass_fds / the fork server's fd passing)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Callable[[Any], int], tuple[Any]]:
        return _adopt_fd, (reduction.DupFd(self.fd),)


def _init(fd: int | _PassedFd, path: str, keep: int) -> None:
    """In the worker: `fd` arrives as the descriptor _PassedFd duplicated into this process."""
    global _worker
    if not isinstance(fd, int):
        raise TypeError("the incident directory's descriptor was not passed to the worker")
    # As the parent reads (loader.paused_gc): the summaries are many small objects and no cycles,
    # and collecting while building them cost 0.5 s of CPU at 16,384 ranks. The worker ends with
    # the pool.
    gc.disable()
    _worker = (SafeDir(Path(path), fd), keep)


def _work(chunk: Chunk) -> ChunkResult:
    from .loader import _load_each  # the loader imports this module

    assert _worker is not None, "a worker runs _init first"
    folder, keep = _worker
    table = IntListTable()

    def build(rank: int, path: str, raw: bytes) -> RankDump:
        doc, records, _ = read_document(raw, table, keep)
        return dump_from_doc(doc, records, path, keep)

    problems: list[DataProblem] = []
    unusable: dict[int, str] = {}
    out = _load_each(folder, chunk[2], build, problems, lambda: None, unusable)
    inline = [r for r, d in out.items() if any(v.members is not None or v.ring is not None for v in d.comms.values())]
    for r in inline:
        del out[r]
    return out, problems, unusable, inline


def load_dumps(folder: SafeDir, files: list[tuple[int, str]], keep: int, build: Callable[[int, str, bytes], Any],
               problems: list[DataProblem], tick: Callable[[], None], unusable: dict[int, str],
               load_each: LoadEach, notes: Optional[list[str]] = None) -> dict[int, Any]:
    """What `load_each(folder, files, build, problems, tick, unusable)` returns, read by worker
    processes; a failure of theirs is added to `notes` (PoolFailure.note)."""
    workers = worker_count(len(files))
    if workers <= 1:
        return load_each(folder, files, build, problems, tick, unusable)
    step = max(64, -(-len(files) // (workers * 8)))
    chunks: list[Chunk] = [(lo, min(lo + step, len(files)), files[lo:lo + step]) for lo in range(0, len(files), step)]
    out: dict[int, Any] = {}
    again: list[tuple[int, str]] = []  # read here: inline lists (1.x), or a chunk the pool could not do
    done = 0
    failure: Optional[tuple[str, str]] = None
    stage = "start"
    try:
        with ProcessPoolExecutor(workers, mp_context=_context(), initializer=_init,
                                 initargs=(_PassedFd(folder.fd), str(folder.path), keep)) as pool:
            stage = "worker"
            for (lo, hi, part_files), (part, probs, bad, inline) in zip(chunks, pool.map(_work, chunks), strict=True):
                out.update(part)
                problems.extend(probs)
                unusable.update(bad)
                back = set(inline)
                again.extend((r, n) for r, n in part_files if r in back)
                for _ in range(hi - lo):
                    tick()
                done += 1
    except Exception as e:  # a pool that cannot start, a worker that died: noted, the rest read here
        failure = (stage, f"{type(e).__name__}: {e}")
    left = [f for _, _, part_files in chunks[done:] for f in part_files]
    if failure is not None and notes is not None:
        notes.append(PoolFailure(failure[0], failure[1], len(left)).note())
    again.extend(left)
    if again:
        out.update(load_each(folder, again, build, problems, tick, unusable))
    order = {r: i for i, (r, _) in enumerate(files)}
    return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))
