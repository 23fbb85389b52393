"""hetobs.ports.free_port: a port the kernel never hands out to a rank's own listener.

CI once failed because a port chosen by bind(0)-and-close was taken by rank 1's data
listener (bound to port 0) before rank 0 bound it for the rendezvous.
"""

from __future__ import annotations

import socket
from pathlib import Path

from hetobs.ports import ephemeral_range, free_port


def test_free_port_is_outside_the_ephemeral_range_and_bindable() -> None:
    lo, hi = ephemeral_range()
    for _ in range(50):
        port = free_port()
        assert not lo <= port <= hi, (port, lo, hi)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_port_skips_a_port_in_use() -> None:
    held = []
    try:
        for _ in range(20):  # each port it gives is free: none repeats while all are held
            s = socket.socket()
            s.bind(("127.0.0.1", free_port()))
            s.listen(1)
            held.append(s)
        assert len({s.getsockname()[1] for s in held}) == 20
    finally:
        for s in held:
            s.close()


def test_kernel_assigned_ports_never_meet_free_port() -> None:
    """Listeners bound to port 0 (as every rank's data listener is) stay in the ephemeral range."""
    lo, hi = ephemeral_range()
    socks = [socket.socket() for _ in range(30)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
            assert lo <= s.getsockname()[1] <= hi
    finally:
        for s in socks:
            s.close()


def test_ephemeral_range_reads_the_file_and_falls_back(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(str(f)) == (40000, 50000)
    for bad in ("", "x y", "50000 40000", "0 70000", "1 2 3"):
        f.write_text(bad)
        assert ephemeral_range(str(f)) == (32768, 60999), bad
    assert ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
