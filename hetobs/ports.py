"""A free TCP port for a server that another process will bind (a rendezvous, an exporter).

The usual trick (bind port 0, read the port, close) hands out a port from the kernel's
ephemeral range, the very range from which every rank's own listener (bound to port 0) and
every outgoing connection take theirs. Between the close and the server's bind, one of them
may take it: CI once saw rank 1's data listener get rank 0's rendezvous port, and the job
failed with "Address already in use". A port outside that range is never handed out by the
kernel, so only another explicit binder can race for it; a probe bind skips those in use.
"""

from __future__ import annotations

import random
import socket

__all__ = ["ephemeral_range", "free_port"]

_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LINUX_DEFAULT = (32768, 60999)
# Below this sit the well-known and commonly configured service ports (X11 at 6000, ...).
_LOWEST = 10000
_TRIES = 64


def ephemeral_range(path: str = _RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        with open(path, encoding="ascii") as f:
            lo, hi = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return _LINUX_DEFAULT
    return (lo, hi) if 0 < lo <= hi <= 65535 else _LINUX_DEFAULT


def _outside(lo: int, hi: int) -> list[int]:
    """The ports worth trying: above the service ports, outside the ephemeral range [lo, hi]."""
    return [*range(_LOWEST, lo), *range(max(hi + 1, _LOWEST), 65536)]


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing had bound a moment ago and that the kernel never hands out.

    Where the ephemeral range leaves no room (it covers 10000-65535), falls back to a port the
    kernel picks, with the race described above.
    """
    ports = _outside(*ephemeral_range())
    for _ in range(_TRIES if ports else 0):
        port = random.choice(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
