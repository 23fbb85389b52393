"""A job directory as a library sees it: rank metadata, incidents, on-demand dumps.

Layout and formats: docs/dump-schema.md. Reading is tolerant (a missing or corrupt
rank file is reported, not raised); asking for dumps goes peer to peer over each
rank's side channel, so it reaches every host and works with any rank stopped.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .ownership import UntrustedJobDir, check_job_dir, unsafe_dir

__all__ = ["JobNotFound", "RankFile", "OnDemandResult", "JobSummary", "job_path", "read_ranks", "request_dump",
           "list_jobs", "rank_state", "SECRET_FILE", "read_secret", "store_secret", "job_secret", "make_job_dir"]

# The job's secret as `hetobs run` made it, in the job directory (0600, its owner's only).
SECRET_FILE = "secret"
_SECRET_MAX = 1024


class JobNotFound(FileNotFoundError):
    """No job directory (or no rank metadata in it) for this job id."""


@dataclass(frozen=True)
class RankFile:
    rank: int
    path: str
    data: dict[str, Any] | None  # None when unreadable
    problem: str | None = None


@dataclass
class OnDemandResult:
    incident: str
    asked: list[int] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)
    unanswered: dict[int, str] = field(default_factory=dict)  # rank -> why
    skipped: dict[int, str] = field(default_factory=dict)  # rank -> why (exited cleanly, no address)
    files: dict[int, str] = field(default_factory=dict)  # rank -> dump written
    missing: list[int] = field(default_factory=list)  # answered but no file before the deadline


def job_path(root: str, job: str) -> str:
    if not job or "/" in job or job in (".", ".."):
        raise ValueError(f"job id {job!r}: expected a plain name")
    return os.path.join(root, job)


def read_ranks(job_dir: str, *, trust: bool = False) -> dict[int, RankFile]:
    """Every ranks/rank-<r>.json, readable or not. Raises JobNotFound if there is none,
    UntrustedJobDir if the job directory is another user's (unless `trust`)."""
    from .diagnosis.untrusted import RefusedPath, SafeDir

    check_job_dir(job_dir, trust=trust)
    ranks_dir = os.path.join(job_dir, "ranks")
    try:
        with SafeDir.open_root(job_dir) as root, root.subdir("ranks") as folder:
            return _read_rank_files(folder, ranks_dir)
    except FileNotFoundError:
        raise JobNotFound(f"{job_dir}: no such job directory (is HETOBS_DIR / --dir right?)") from None
    except RefusedPath as e:
        raise JobNotFound(f"{ranks_dir}: {e.strerror}") from None


def _read_rank_files(folder: Any, ranks_dir: str) -> dict[int, RankFile]:
    out: dict[int, RankFile] = {}
    for name, _kind in folder.entries():
        if not (name.startswith("rank-") and name.endswith(".json")) or not name[5:-5].isdigit():
            continue
        rank = int(name[5:-5])
        path = os.path.join(ranks_dir, name)
        try:
            # untrusted: never through a link, never a FIFO (it would block) or a device
            data = json.loads(folder.read(name))
            if not isinstance(data, dict) or data.get("schema") != "hetobs.rank":
                out[rank] = RankFile(rank, path, None, "not a hetobs rank file (schema)")
            elif not str(data.get("version", "")).startswith(("1.", "2.")):
                out[rank] = RankFile(rank, path, None, f"rank file version {data.get('version')} is not 1.x or 2.x")
            else:
                out[rank] = RankFile(rank, path, data)
        except (OSError, ValueError) as e:
            out[rank] = RankFile(rank, path, None, f"unreadable: {e.strerror if isinstance(e, OSError) else e}")
    if not out:
        raise JobNotFound(f"{ranks_dir}: no rank metadata (ranks/rank-<r>.json)")
    return out


def _secret_problem(st: os.stat_result, trust: bool) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if not trust and st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if not trust and st.st_mode & 0o077:
        return f"is open to group or others (mode {stat.S_IMODE(st.st_mode):04o}, not 0600)"
    return None


def read_secret(job_dir: str, *, trust: bool = False) -> str | None:
    """The secret `hetobs run` stored in `job_dir`, or None when it holds none.

    Raises UntrustedJobDir (naming the file) for one that may be planted: a link, not a
    regular file, another user's, or open to group or others; also for one this user cannot
    read (another user's job). `trust` (--trust-dir) accepts another owner, never a link.
    """
    path = os.path.join(job_dir, SECRET_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UntrustedJobDir(f"{path}: the job's secret is a symbolic link: not followed (it may be "
                                  "planted)") from None
        raise UntrustedJobDir(f"{path}: the job's secret cannot be read ({e.strerror}): only the job's owner "
                              "can reach its ranks") from None
    try:
        why = _secret_problem(os.fstat(fd), trust)
        if why:
            raise UntrustedJobDir(f"{path}: the job's secret {why}: not used (it may be planted)")
        raw = os.read(fd, _SECRET_MAX + 1)
    finally:
        os.close(fd)
    text = raw.decode("ascii", errors="replace").strip()
    if not text or len(raw) > _SECRET_MAX or not text.isprintable():
        raise UntrustedJobDir(f"{path}: not a hetobs secret (empty, over {_SECRET_MAX} bytes or not text)")
    return text


def _refuse_unsafe(path: str, shared: bool) -> None:
    why = unsafe_dir(path, shared_root=shared)
    if why:
        raise UntrustedJobDir(f"{path}: directory {why}: hetobs writes nothing there (remove it, or point "
                              "HETOBS_DIR at a directory of your own)")


def make_job_dir(job_dir: str) -> bool:
    """Make `job_dir` (0700; HETOBS_DIR too if absent) and check both as the ranks check them
    (csrc/src/observe/job_dir.cc): HETOBS_DIR ours or a sticky root's, the job directory ours,
    a real directory, writable by no one else. True when it was made now, False when it was
    there. Raises UntrustedJobDir naming what was refused, OSError when it cannot be made."""
    root = os.path.dirname(job_dir)
    os.makedirs(root, mode=0o700, exist_ok=True)
    _refuse_unsafe(root, shared=True)
    try:
        os.mkdir(job_dir, 0o700)
        made = True
    except FileExistsError:
        made = False
    _refuse_unsafe(job_dir, shared=False)
    return made


def store_secret(job_dir: str, secret: str) -> str:
    """Keep `secret` in `job_dir` for the job's owner (file `secret`, 0600) and return the one in use.

    The job directory is made as make_job_dir makes it. A job id started again keeps the
    secret it has. Raises UntrustedJobDir naming what was refused, OSError when it cannot be written.
    """
    make_job_dir(job_dir)
    kept = read_secret(job_dir)
    if kept is not None:
        return kept
    path = os.path.join(job_dir, SECRET_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:  # another `hetobs run` of this job id made it first: use theirs
        return read_secret(job_dir) or secret
    try:
        os.write(fd, (secret + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret


def job_secret(job_dir: str, *, trust: bool = False) -> str:
    """The key to sign requests to the job's ranks with: HETOBS_SECRET when the caller has it,
    else the secret stored in the job directory, else "" (the job id is the key)."""
    from .config import from_env

    return from_env().secret or read_secret(job_dir, trust=trust) or ""


@dataclass(frozen=True)
class JobSummary:
    """One job directory under HETOBS_DIR, as `hetobs jobs` lists it."""

    job: str
    path: str
    start_time_ns: int | None  # the earliest rank's start
    hosts: list[str]
    ranks: int  # rank files found
    world_size: int | None
    state: str  # running | exited | dead | unknown (see rank_state)
    rank_states: dict[int, str]
    incidents: int
    problems: dict[int, str] = field(default_factory=dict)  # rank -> why its file is unusable
    refused: str | None = None  # why the directory was not read (another user's): state "refused"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rank_state(data: dict[str, Any], host: str, proc: str = "/proc") -> str:
    """'exited' (marked exited_cleanly), 'running' or 'stopped' (its process is there), 'dead'
    (gone without a clean exit, or recorded in an earlier boot of this host), or 'unknown'
    (another host: its process cannot be looked at)."""
    from .stats import process_state

    if data.get("exited_cleanly") is True:
        return "exited"
    pid = _int(data.get("pid"))
    if data.get("host") != host or pid is None or pid <= 0:
        return "unknown"
    boot = data.get("boot_id")
    state = process_state(pid, _int(data.get("process_start_time")) or 0, proc,
                          boot=boot if isinstance(boot, str) else None)
    return {"alive": "running", "stopped": "stopped", "dead": "dead", "reused": "dead"}.get(state, "unknown")


def _job_state(states: list[str]) -> str:
    if any(s in ("running", "stopped") for s in states):
        return "running"
    if states and all(s == "exited" for s in states):
        return "exited"
    if "dead" in states:
        return "dead"
    return "unknown"


def list_jobs(root: str, *, proc: str = "/proc") -> list[JobSummary]:
    """Every job directory under `root` that holds rank metadata, newest first.

    Everything here is read from files other processes wrote: unreadable rank files are
    counted in `problems`, never raised; a directory without rank files is not a job.
    """
    import socket

    host = socket.gethostname()
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    jobs = []
    for name in names:
        path = os.path.join(root, name)
        if not os.path.isdir(os.path.join(path, "ranks")):
            continue
        try:
            ranks = read_ranks(path)
        except JobNotFound:
            continue
        except UntrustedJobDir as e:
            jobs.append(JobSummary(job=name, path=path, start_time_ns=None, hosts=[], ranks=0, world_size=None,
                                   state="refused", rank_states={}, incidents=0, refused=str(e)))
            continue
        good = {r: rf.data for r, rf in ranks.items() if rf.data is not None}
        states = {r: rank_state(d, host, proc) for r, d in good.items()}
        starts = [t for d in good.values() if (t := _int(d.get("start_time_ns"))) is not None]
        worlds = {w for d in good.values() if (w := _int(d.get("world_size"))) is not None}
        try:
            incidents = len(os.listdir(os.path.join(path, "incidents")))
        except OSError:
            incidents = 0
        jobs.append(JobSummary(
            job=name, path=path, start_time_ns=min(starts) if starts else None,
            hosts=sorted({str(d.get("host")) for d in good.values() if d.get("host")}), ranks=len(ranks),
            world_size=max(worlds) if worlds else None, state=_job_state(list(states.values())),
            rank_states=dict(sorted(states.items())), incidents=incidents,
            problems={r: rf.problem or "unreadable" for r, rf in ranks.items() if rf.data is None}))
    jobs.sort(key=lambda j: j.start_time_ns or 0, reverse=True)
    return jobs


def request_dump(job_dir: str, *, secret: str | None = None, timeout: float = 10.0,
                 cause: str = "hetobs dump (on demand)", trust: bool = False) -> OnDemandResult:
    """Ask every live rank of the job to dump now, into one new incident; wait (bounded) for the files.

    Ranks marked exited_cleanly are skipped. Each rank's answer comes from its own side
    channel; a stopped or dead rank shows up in `unanswered`. Requests are signed with
    `secret`, by default job_secret's (the caller's HETOBS_SECRET, else the job's stored one).
    """
    from . import _core

    ranks = read_ranks(job_dir, trust=trust)
    secret = job_secret(job_dir, trust=trust) if secret is None else secret
    incident = f"ondemand-{int(time.time() * 1000)}-{secrets.token_hex(2)}"
    result = OnDemandResult(incident)
    request = f"dump\n{incident}\non_demand\n-1\n{cause}"
    targets: list[tuple[int, str, int, str]] = []
    for rank, rf in sorted(ranks.items()):
        if rf.data is None:
            result.skipped[rank] = rf.problem or "unreadable rank file"
            continue
        if rf.data.get("exited_cleanly"):
            result.skipped[rank] = "exited cleanly"
            continue
        sc = rf.data.get("side_channel") or {}
        if not sc.get("port"):
            result.skipped[rank] = "no side-channel address"
            continue
        targets.append((rank, str(sc.get("ip", "127.0.0.1")), int(sc["port"]), str(rf.data.get("job", ""))))
    lock = threading.Lock()

    def ask(rank: int, ip: str, port: int, job: str) -> None:
        try:
            reply = _core.side_channel_request(ip, port, job, secret, request, min(timeout, 3.0))
            ok, why = reply.startswith("ok"), reply
        except Exception as e:  # an unreachable rank is a result, not an error
            ok, why = False, str(e)
        with lock:
            result.asked.append(rank)
            if ok:
                result.answered.append(rank)
            else:
                result.unanswered[rank] = why

    threads = [threading.Thread(target=ask, args=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.asked.sort()
    result.answered.sort()
    deadline = time.monotonic() + timeout
    pending = set(result.answered)
    inc_dir = os.path.join(job_dir, "incidents", incident)
    while pending:
        for rank in sorted(pending):
            path = os.path.join(inc_dir, f"rank-{rank}.json")
            if os.path.exists(path):
                result.files[rank] = path
        pending -= set(result.files)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.05)  # files appear via rename; there is no event to wait on across hosts
    result.missing = sorted(pending)
    return result
