"""Silent strangers: connections that are opened to a listener and then never say a word.

`Strangers` keeps `n` of them open on each target (a TCP port or a Unix socket path) from a
background thread: a connection the server drops (its handshake deadline passed) is opened
again at once, so the listener faces `n` silent peers the whole time. It reads and discards
whatever the server sends (its hello) and never writes. close() closes every socket.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import threading
import time
from typing import Union

Target = Union[tuple[str, int], str]  # (host, port) or a Unix socket path


class Strangers:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._want: dict[Target, int] = {}
        self._quiet_until: dict[Target, float] = {}  # a target that refused us: not before then
        self._open: dict[Target, set[socket.socket]] = {}
        self._lock = threading.Lock()
        self._stop = False
        self._wake_r, self._wake_w = os.pipe()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.reconnects = 0  # connections dropped by a server after its greeting
        self._heard: set[socket.socket] = set()
        self.dropped: dict[Target, int] = {}  # connections each target closed on us
        self._thread = threading.Thread(target=self._loop, name="strangers", daemon=True)
        self._thread.start()

    def add(self, target: Target, n: int) -> None:
        with self._lock:
            self._want[target] = self._want.get(target, 0) + n
        os.write(self._wake_w, b"x")

    def remove(self, target: Target) -> None:
        """Stop keeping strangers on `target` (e.g. a rendezvous port that has closed)."""
        with self._lock:
            self._want.pop(target, None)
            for s in self._open.pop(target, set()):
                self._sel.unregister(s)
                s.close()

    def count(self, target: Target) -> int:
        with self._lock:
            return len(self._open.get(target, ()))

    def _connect(self, target: Target) -> bool:
        """Open one more; False if the target does not accept connections (yet)."""
        if isinstance(target, str):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            rc = s.connect_ex(target)
        except OSError as e:  # a Unix socket path that is not there yet
            rc = e.errno or errno.ECONNREFUSED
        if rc not in (0, errno.EINPROGRESS):  # a Unix socket's EAGAIN: its backlog is full, not connected
            s.close()
            return False
        self._open.setdefault(target, set()).add(s)
        self._sel.register(s, selectors.EVENT_READ, target)
        return True

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._stop:
                    return
                now = time.monotonic()
                for target, n in self._want.items():
                    if self._quiet_until.get(target, 0.0) > now:
                        continue
                    while len(self._open.get(target, ())) < n:
                        if not self._connect(target):
                            break  # not listening (yet): again within 50 ms
            for key, _ in self._sel.select(timeout=0.05):
                if key.data is None:
                    os.read(self._wake_r, 4096)
                    continue
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = s.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data:
                    self._heard.add(s)
                    continue
                # The server gave up on us: be silent again, on a new connection. One that never
                # even greeted us was refused (not listening yet, or any more): retry in 50 ms.
                with self._lock:
                    if s not in self._open.get(key.data, set()):
                        continue  # remove() closed it meanwhile
                    self._sel.unregister(s)
                    self._open[key.data].discard(s)
                    if s in self._heard:
                        self._heard.discard(s)
                        self.dropped[key.data] = self.dropped.get(key.data, 0) + 1
                        self.reconnects += 1
                    else:
                        self._quiet_until[key.data] = time.monotonic() + 0.05
                    s.close()

    def close(self) -> None:
        with self._lock:
            self._stop = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        for socks in self._open.values():
            for s in socks:
                s.close()
        self._open.clear()
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
