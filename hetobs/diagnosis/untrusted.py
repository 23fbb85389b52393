"""Files under a job or Flight Recorder directory are untrusted: open them without following links.

Anyone who can write to the job directory chooses what lies there, and `hetobs
diagnose` may run as another user (or root). So, below the directory the user named:
- a symbolic link is never followed: a "dump" linking to /etc/shadow is refused, not read;
- only regular files are opened: a FIFO named like a dump would block a reader forever,
  a device could be endless; both are refused, and O_NONBLOCK keeps even the open
  from waiting when an entry is swapped for a FIFO after it was listed;
- directories are entered by descriptor (openat with O_NOFOLLOW), so a `ranks/` or
  `incidents/<id>/` that is a link is refused too, and one swapped for a link between
  listing and reading is not followed either.
The root itself is the user's choice (HETOBS_DIR may well be a link to shared storage)
and is followed. A refusal raises `RefusedPath`, an OSError whose text says what the
entry is; the loaders turn it into a data problem naming the path.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional

__all__ = ["RefusedPath", "SafeDir", "describe_mode", "refusal"]

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 16


class RefusedPath(OSError):
    """An entry that is not what a reader may open (a link, a FIFO, a device...)."""


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISREG, "a regular file"))


def describe_mode(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def refusal(what: str, wanted: str = "a regular file") -> str:
    """Why an entry that is `what` (describe_mode's words) was not opened as `wanted`."""
    if what == "a symbolic link":
        return "is a symbolic link: not followed (links inside a job or dump directory are never read)"
    return f"is {what}, not {wanted}: not opened"


class SafeDir:
    """An open directory; its entries are listed and opened relative to its descriptor."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open_root(cls, path: "str | os.PathLike[str]") -> "SafeDir":
        """The directory the user named (links followed: it is their choice)."""
        return cls(Path(path), os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))

    def __enter__(self) -> "SafeDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _lstat_kind(self, name: str) -> Optional[str]:
        try:
            return describe_mode(os.lstat(name, dir_fd=self.fd).st_mode)
        except OSError:
            return None

    def subdir(self, name: str) -> "SafeDir":
        """Enter `name`; RefusedPath when it is a link or not a directory, FileNotFoundError if absent."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                what = self._lstat_kind(name) or "not a directory"
                raise RefusedPath(e.errno, refusal(what, "a directory"), str(self.path / name)) from None
            raise
        return SafeDir(self.path / name, fd)

    def entries(self) -> list[tuple[str, str]]:
        """(name, kind) of every entry, sorted by name; kind as `describe_mode` says it (no link followed)."""
        out: list[tuple[str, str]] = []
        with os.scandir(self.fd) as it:
            for e in it:
                try:
                    kind = describe_mode(e.stat(follow_symlinks=False).st_mode)
                except OSError:
                    kind = "unreadable"
                out.append((e.name, kind))
        out.sort()
        return out

    def read(self, name: str, limit: Optional[int] = None) -> bytes:
        """The bytes of regular file `name` (at most `limit`); RefusedPath for anything else."""
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RefusedPath(e.errno, refusal("a symbolic link"),
                                  str(self.path / name)) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RefusedPath(errno.EINVAL, refusal(describe_mode(st.st_mode)), str(self.path / name))
            parts: list[bytes] = []
            left = limit
            want = max(st.st_size + 1, _CHUNK)  # the whole file in one read, as a rule
            while left is None or left > 0:
                chunk = os.read(fd, want if left is None else min(want, left))
                if not chunk:
                    break
                parts.append(chunk)
                if left is not None:
                    left -= len(chunk)
                # The read that only finds the end: small, since a big request allocates its
                # whole size first (at 16,384 dumps of 150 KB that doubled the reading time).
                want = _CHUNK
            return b"".join(parts)
        finally:
            os.close(fd)
