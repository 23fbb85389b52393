"""Remove what dead ranks left on this node: stats segments, transport segments, control sockets.

A rank killed by the scheduler (the usual end of a hung job) never removes its stats
segment (/dev/shm/hetobs-stats-<job>-r<rank>, about 1 MiB of RAM each), a transport
segment it made but had not yet shared, or its control socket (/tmp/hetobs-<uid>/*.sock).
`clean()` removes exactly those whose process is gone, and never a live one's:
- a stats segment names its pid, that process's start time (/proc/<pid>/stat field 22)
  and the machine's boot id, so neither a pid recycled by another process nor one of an
  earlier boot (a /dev/shm that outlived a reboot, as a persistent container mount can)
  is mistaken for the rank;
- a transport segment's name carries its creator's pid; it is stale when that pid is
  gone, or when the process with that pid started after the segment was made;
- a control socket is stale when connecting to it is refused: nothing listens there.
Only entries owned by this user are looked at (the others are not ours to judge), and
links are never followed. Nothing here prints: the CLI (`hetobs clean`) does.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
from dataclasses import dataclass, field
from typing import Collection, Optional

from .ownership import not_ours
from .stats import StatsError, other_boot, read_segment

__all__ = ["Leftover", "CleanResult", "clean", "control_socket_dir"]

_STATS = re.compile(r"hetobs-stats-.+-r\d+")
_TRANSPORT = re.compile(r"hetobs-(\d+)-[0-9a-f]{16}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Leftover:
    path: str
    kind: str  # stats_segment | transport_segment | control_socket
    bytes: int
    why: str  # what shows its process is gone


@dataclass
class CleanResult:
    dry_run: bool
    removed: list[Leftover] = field(default_factory=list)  # (dry run: would be removed)
    kept: int = 0  # entries of ours still in use
    errors: list[str] = field(default_factory=list)  # "path: why" for what could not be removed

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removed)


def control_socket_dir() -> str:
    """Where ranks put their control sockets (csrc/src/observe/side_channel.cc)."""
    return f"/tmp/hetobs-{os.getuid()}"


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _boot_time(proc: str) -> Optional[float]:
    try:
        with open(f"{proc}/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def _process_start(pid: int, proc: str) -> Optional[float]:
    """Wall-clock start of `pid` in seconds, or None when there is no such process."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    boot = _boot_time(proc)
    return (boot or 0.0) + int(rest[19]) / _clock_ticks()


def _stats_segment_gone(path: str, proc: str) -> Optional[str]:
    try:
        s = read_segment(path, proc=proc)
    except StatsError:
        return None  # not one we can read (another layout version, being created): not judged
    if other_boot(s.boot_id, proc):
        return f"pid {s.pid} (rank {s.rank} of job {s.job}) ran in an earlier boot of this machine"
    if s.process == "dead":
        return f"pid {s.pid} (rank {s.rank} of job {s.job}) is gone"
    if s.process == "reused":
        return f"pid {s.pid} (rank {s.rank} of job {s.job}) now belongs to another process"
    return None


def _transport_segment_gone(pid: int, st: os.stat_result, proc: str) -> Optional[str]:
    started = _process_start(pid, proc)
    if started is None:
        return f"pid {pid} is gone"
    if started > st.st_mtime + 1.0:  # tick-rounded start times: a second of slack
        return f"pid {pid} now belongs to a process started after the segment was made"
    return None


def _socket_gone(path: str) -> Optional[str]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
    except ConnectionRefusedError:
        return "nothing listens on it"
    except OSError:
        return None  # cannot tell (a full backlog, a timeout): keep it
    finally:
        s.close()
    return None


def _stale_sockets(sock_dir: str, found: list[Leftover], result: CleanResult) -> None:
    try:
        dir_problem = not_ours(os.lstat(sock_dir))
    except OSError:
        return  # no such directory: no sockets
    if dir_problem is not None:
        result.errors.append(f"{sock_dir}: {dir_problem}: not looked into")
        return
    for name, st in _scan(sock_dir):
        if not (name.endswith(".sock") and stat.S_ISSOCK(st.st_mode)) or st.st_uid != os.geteuid():
            continue
        path = os.path.join(sock_dir, name)
        why = _socket_gone(path)
        if why:
            found.append(Leftover(path, "control_socket", 0, why))
        else:
            result.kept += 1


def _scan(folder: str) -> list[tuple[str, os.stat_result]]:
    out: list[tuple[str, os.stat_result]] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in sorted(names):
        try:
            out.append((name, os.lstat(os.path.join(folder, name))))
        except OSError:
            continue
    return out


def clean(*, dry_run: bool = False, shm_dir: str = "/dev/shm", socket_dir: Optional[str] = None,
          proc: str = "/proc", among: Optional[Collection[str]] = None) -> CleanResult:
    """Remove (or with `dry_run`, list) this user's leftovers of dead ranks on this node.

    `among`: judge only these names in `shm_dir` (the entries a caller saw appear while it ran
    ranks), and no control socket."""
    result = CleanResult(dry_run=dry_run)
    found: list[Leftover] = []
    for name, st in _scan(shm_dir):
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or among is not None and name not in among:
            continue
        path = os.path.join(shm_dir, name)
        why: Optional[str] = None
        if _STATS.fullmatch(name):
            kind, why = "stats_segment", _stats_segment_gone(path, proc)
        elif m := _TRANSPORT.fullmatch(name):
            kind, why = "transport_segment", _transport_segment_gone(int(m.group(1)), st, proc)
        else:
            continue
        if why:
            found.append(Leftover(path, kind, st.st_blocks * 512, why))
        else:
            result.kept += 1
    if among is None:
        _stale_sockets(socket_dir or control_socket_dir(), found, result)
    for item in found:
        if not dry_run:
            try:
                os.unlink(item.path)
            except OSError as e:
                if e.errno != errno.ENOENT:  # gone already: someone cleaned it first
                    result.errors.append(f"{item.path}: {e.strerror}")
                continue
        result.removed.append(item)
    return result
