"""Whose is this file or directory: the one check every reader of node-local state makes.

/dev/shm and /tmp are writable by every local user, and a job directory may have been
made by someone else first. What another user owns, or can write, may be planted: a
fake stats segment, incidents that would blame healthy hosts (`--exclude-hosts`), a
control socket in our name. Readers and cleaners therefore use only what belongs to the
effective user and is not writable by group or others (the native core refuses the same
directories when it writes: csrc/src/observe/job_dir.cc unsafeDirReason).
"""

from __future__ import annotations

import os
import stat
from typing import Optional

__all__ = ["not_ours", "unsafe_dir", "job_dir_not_ours", "untrusted_job_dir_text", "UntrustedJobDir", "check_job_dir"]


def not_ours(st: os.stat_result, *, shared_root: bool = False) -> Optional[str]:
    """Why an entry with this (l)stat is not safely ours, or None when it is.

    `shared_root`: a root such as HETOBS_DIR may also belong to root and be writable by all
    when sticky (like /tmp), since no one else can then rename what we make inside it.
    """
    me = os.geteuid()
    if st.st_uid != me and not (shared_root and st.st_uid == 0):
        return f"is owned by uid {st.st_uid}, not by this user (uid {me})"
    sticky = shared_root and bool(st.st_mode & stat.S_ISVTX)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def unsafe_dir(path: str, *, shared_root: bool = False) -> Optional[str]:
    """Why directory `path` may not hold our files, or None when it may (csrc's unsafeDirReason).

    Below a root no link is followed (lstat); a `shared_root` (HETOBS_DIR) is the user's choice
    and may be a link.
    """
    try:
        st = os.stat(path) if shared_root else os.lstat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    return not_ours(st, shared_root=shared_root)


def job_dir_not_ours(st: os.stat_result) -> Optional[str]:
    """Why a job directory with this stat may not be read, or None when it may.

    Ours or root's (root could change any file anyway), and writable by no one else: every
    reader of a job directory (`hetobs diagnose`, `dump`, `top`, `trace`, `plan`, `jobs`, the
    exporter) makes this one check before it reads a file there.
    """
    if st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return not_ours(st)


class UntrustedJobDir(PermissionError):
    """A job directory that another user owns or can write: none of its files is read."""


def untrusted_job_dir_text(why: str) -> str:
    return f"job directory {why}: not read, since another user may have planted its files (--trust-dir reads it anyway)"


def check_job_dir(job_dir: str, *, trust: bool = False) -> None:
    """Raise UntrustedJobDir (its text names the path) unless `job_dir` may be read; an absent one may.

    The directory itself is followed (HETOBS_DIR/<job> may be a link the user made); what lies
    inside is then opened with hetobs.diagnosis.untrusted.SafeDir.
    """
    if trust:
        return
    try:
        st = os.stat(job_dir)
    except FileNotFoundError:
        return
    except OSError as e:
        raise UntrustedJobDir(f"{job_dir}: job directory cannot be read ({e.strerror})") from None
    why = job_dir_not_ours(st)
    if why:
        raise UntrustedJobDir(f"{job_dir}: {untrusted_job_dir_text(why)}")
    if not os.access(job_dir, os.R_OK | os.X_OK):  # root's 0700 job, read by another user
        raise UntrustedJobDir(f"{job_dir}: job directory cannot be read by this user (uid {os.geteuid()}; it is "
                              f"uid {st.st_uid}'s, mode {stat.S_IMODE(st.st_mode):04o}): only the job's owner can "
                              "reach its ranks")
