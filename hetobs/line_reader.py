"""Whole lines from several pipes or sockets at once, with one deadline for all of them.

A launcher that talks to its ranks line by line (`hetobs bench`'s workers answer each
command with one JSON line; the demo's ranks print "READY ...") waits for a line from
every rank together: a rank that dies is seen at once (its end of file), not after the
ranks before it have answered. Reads never block past the deadline and never poll.
"""

from __future__ import annotations

import os
import selectors
import time
from typing import Sequence

__all__ = ["LineEnd", "LineReader", "LineTimeout"]


class LineTimeout(TimeoutError):
    """No whole line came from `missing` (source indexes) before the deadline."""

    def __init__(self, missing: list[int], timeout: float) -> None:
        super().__init__(f"no line from source(s) {missing} within {timeout:g} s")
        self.missing = missing
        self.timeout = timeout


class LineEnd(EOFError):
    """Source `source` reached its end (the writer exited or closed it) before a whole line."""

    def __init__(self, source: int) -> None:
        super().__init__(f"source {source} ended")
        self.source = source


class LineReader:
    """Reads lines from the file descriptors `fds` (source i is fds[i]); keeps the last
    `keep` bytes read from each, for a report when something went wrong."""

    def __init__(self, fds: Sequence[int], keep: int = 1 << 16) -> None:
        self.fds = list(fds)
        self.keep = keep
        self._buf = [b""] * len(self.fds)
        self._seen = [b""] * len(self.fds)
        self._ended: set[int] = set()  # sources that reached their end

    def _take(self, i: int) -> bytes | None:
        if b"\n" not in self._buf[i]:
            return None
        line, self._buf[i] = self._buf[i].split(b"\n", 1)
        return line

    def read(self, which: Sequence[int], timeout: float) -> dict[int, bytes]:
        """The next line (without its newline) from each source in `which`.

        Raises LineTimeout naming the sources still without a line after `timeout` seconds,
        or LineEnd for the first source that ended first.
        """
        got: dict[int, bytes] = {}
        for i in which:
            line = self._take(i)
            if line is not None:
                got[i] = line
        pending = [i for i in which if i not in got]
        end = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for i in pending:
                sel.register(self.fds[i], selectors.EVENT_READ, i)
            while pending:
                left = end - time.monotonic()
                if left <= 0:
                    raise LineTimeout(pending, timeout)
                for key, _ in sel.select(left):
                    i = key.data
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        self._ended.add(i)
                        raise LineEnd(i)
                    self._buf[i] += chunk
                    self._seen[i] = (self._seen[i] + chunk)[-self.keep:]
                    line = self._take(i)
                    if line is not None:
                        got[i] = line
                        pending.remove(i)
                        sel.unregister(key.fd)
        return got

    def drain(self, timeout: float) -> None:
        """Read every source to its end (the writers are gone) or until `timeout`, into seen()."""
        end = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for i, fd in enumerate(self.fds):
                if i not in self._ended:
                    sel.register(fd, selectors.EVENT_READ, i)
            while sel.get_map() and (left := end - time.monotonic()) > 0:
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        self._ended.add(key.data)
                    self._seen[key.data] = (self._seen[key.data] + chunk)[-self.keep:]

    def seen(self, i: int) -> str:
        """The last bytes read from source i (lines taken or not), as text."""
        return self._seen[i].decode(errors="replace")
