"""Where exporters get their numbers: a snapshot of every rank's stats segment.

Every exporter (Prometheus collector, OpenTelemetry instruments and spans, `hetobs
top`, `hetobs trace --live`) reads through a `SnapshotSource`, so they all see the
same numbers and tests can point them at any directory of segments.

The segments are read from outside the ranks (hetobs/stats.py, no locks taken on the
writer), so a snapshot still answers while a rank hangs, is SIGSTOPped, holds the
GIL, or has died — and reading costs the ranks nothing. One bad segment never spoils
the rest: it becomes a `RankEntry` with a `problem` (and one log line per change),
and the other ranks are read as usual.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from hetobs import stats

__all__ = ["RankEntry", "Snapshot", "SnapshotSource", "ShmSource", "InProcessSource", "classify"]

log = logging.getLogger("hetobs.exporters")


@dataclass(frozen=True)
class RankEntry:
    """One rank as a snapshot saw it: its stats, or why there are none."""

    rank: int
    path: str
    stats: stats.RankStats | None
    problem: str | None = None  # one of naming.SEGMENT_PROBLEMS; None when `stats` is usable
    detail: str = ""  # the reader's message for a problem
    exited_cleanly: bool = False  # the segment is gone because the rank closed normally
    host: str = ""  # from the segment, else remembered, else this node (segments are node-local)

    @property
    def live(self) -> bool:
        """Read, and its process still exists (running or stopped)."""
        return self.stats is not None and not self.stats.stale


@dataclass(frozen=True)
class Snapshot:
    """Every rank of one job on this node at one moment (wall clock `time_ns`)."""

    job: str
    time_ns: int
    ranks: tuple[RankEntry, ...]
    read_seconds: float = 0.0  # time the source took to read the segments


class SnapshotSource(Protocol):
    """What exporters read from. `records`: how many of each rank's newest op records to include."""

    job: str

    def snapshot(self, records: int = 0) -> Snapshot: ...


def classify(err: stats.StatsError) -> str:
    """Map a reader error to a bounded problem label (naming.SEGMENT_PROBLEMS)."""
    msg = str(err)
    if "cannot open (No such file" in msg:
        return "vanished"
    if "stats layout version" in msg:
        return "version"
    if "truncated" in msg:
        return "truncated"
    if "not a hetobs stats segment" in msg:
        return "foreign"
    return "unreadable"


def _rank_of(path: str) -> int | None:
    tail = path.rsplit("-r", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _same_job(job: str, header_job: str) -> bool:
    """The header keeps the id's first 63 bytes: a cut id is ours when it is a prefix of `job`."""
    if header_job == job:
        return True
    return len(header_job.encode()) >= 63 and job.startswith(header_job)


def _read(path: str, rank: int, records: int, proc: str, host: str) -> RankEntry:
    try:
        seg = stats.read_segment(path, records=records, proc=proc)
        return RankEntry(rank, path, seg, host=seg.host or host)
    except stats.StatsError as e:
        return RankEntry(rank, path, None, classify(e), str(e), host=host)


class _ProblemLog:
    """Logs a rank's problem once when it appears or changes, not on every scrape."""

    def __init__(self) -> None:
        self._last: dict[int, str | None] = {}

    def note(self, entry: RankEntry) -> None:
        key = f"{entry.problem}:{entry.detail}" if entry.problem else None
        if entry.stats is not None and entry.stats.stale:
            key = f"stale:{entry.stats.process}"
        if self._last.get(entry.rank) == key:
            return
        self._last[entry.rank] = key
        if entry.problem:
            log.warning("rank %d: %s (%s); exported as hetobs_rank_up 0", entry.rank, entry.detail, entry.problem)
        elif key:
            log.warning("rank %d: %s: process %d is %s; its counters are history", entry.rank, entry.path,
                        entry.stats.pid if entry.stats else -1, entry.stats.process if entry.stats else "?")


class ShmSource:
    """Every rank segment of `job` in `shm_dir` (this node).

    Ranks seen once and gone later are kept as `vanished` (or `exited_cleanly` when the
    job directory's rank file says so), so a rank that disappears shows up as down
    instead of silently dropping out of sums.
    """

    def __init__(self, job: str, *, shm_dir: str = "/dev/shm", job_dir: str | None = None,
                 proc: str = "/proc") -> None:
        self.job = job
        self.shm_dir = shm_dir
        self.job_dir = job_dir
        self.proc = proc
        self._seen: dict[int, tuple[str, str]] = {}  # rank -> (path, host)
        self._host = socket.gethostname()
        self._lock = threading.Lock()
        self._log = _ProblemLog()

    def _exited_cleanly(self, rank: int) -> bool:
        if not self.job_dir:
            return False
        from hetobs.diagnosis.untrusted import SafeDir

        try:  # untrusted files: no link followed, regular files only
            with SafeDir.open_root(self.job_dir) as root, root.subdir("ranks") as ranks:
                return bool(json.loads(ranks.read(f"rank-{rank}.json")).get("exited_cleanly"))
        except (OSError, ValueError, AttributeError):
            return False

    def snapshot(self, records: int = 0) -> Snapshot:
        now, t0 = time.time_ns(), time.perf_counter()
        entries: dict[int, RankEntry] = {}
        for path in stats.segment_paths(self.job, self.shm_dir):
            rank = _rank_of(path)
            if rank is None:
                continue
            with self._lock:
                host = self._seen.get(rank, ("", self._host))[1]
            entry = _read(path, rank, records, self.proc, host)
            # Names are sanitised ("a b" and "a_b" share one): the header's id says whose it is.
            if entry.stats is not None and not _same_job(self.job, entry.stats.job):
                continue
            entries[rank] = entry
        with self._lock:
            for rank, entry in entries.items():
                self._seen[rank] = (entry.path, entry.host)
            for rank, (path, host) in self._seen.items():
                if rank not in entries:
                    clean = self._exited_cleanly(rank)
                    entries[rank] = RankEntry(rank, path, None, None if clean else "vanished",
                                              "" if clean else f"{path}: segment gone (the rank was removed or "
                                              "its /dev/shm entry deleted)", exited_cleanly=clean, host=host)
            ordered = tuple(entries[r] for r in sorted(entries))
            for entry in ordered:
                self._log.note(entry)
        return Snapshot(self.job, now, ordered, time.perf_counter() - t0)


class InProcessSource:
    """This process's own segment, for `start_http_server` inside a training script.

    Found by pid among the segments of `job` (default: every hetobs segment on the
    node), on the first snapshot after `hetobs.init()`; empty snapshots before that.
    """

    def __init__(self, job: str | None = None, *, shm_dir: str = "/dev/shm", proc: str = "/proc") -> None:
        self.job = job or ""
        self.shm_dir = shm_dir
        self.proc = proc
        self._path: str | None = None
        self._rank = 0
        self._lock = threading.Lock()

    def _find(self) -> None:
        import glob

        pattern = (stats.segment_paths(self.job, self.shm_dir) if self.job
                   else sorted(glob.glob(os.path.join(self.shm_dir, "hetobs-stats-*"))))
        for path in pattern:
            rank = _rank_of(path)
            if rank is None:
                continue
            try:
                seg = stats.read_segment(path, proc=self.proc)
            except stats.StatsError:
                continue
            if seg.pid == os.getpid() and not seg.exited_cleanly:
                self._path, self._rank, self.job = path, rank, seg.job
                return

    def snapshot(self, records: int = 0) -> Snapshot:
        now, t0 = time.time_ns(), time.perf_counter()
        with self._lock:
            if self._path is None or not os.path.exists(self._path):
                self._path = None
                self._find()
            path, rank = self._path, self._rank
        if path is None:
            return Snapshot(self.job, now, ())
        entry = _read(path, rank, records, self.proc, socket.gethostname())
        return Snapshot(self.job, now, (entry,), time.perf_counter() - t0)
