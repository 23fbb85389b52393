"""Two network namespaces joined by one veth pair whose ends send at a set rate (tc tbf):
the relay benchmark's paced wire, so its three stages can be balanced (root only).

Rank 0 runs in the first namespace (198.19.255.1), rank 1 in the second (198.19.255.2);
both directions are limited, since a relay sends both ways at once. Everything goes with
the namespaces (close(), also on failure).
"""

from __future__ import annotations

import os
import subprocess
import uuid

__all__ = ["PacedLink", "NetnsError"]


class NetnsError(RuntimeError):
    """The namespaces or the rate limit could not be set up (the message says which command)."""


def _run(*args: str) -> None:
    p = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=30)
    if p.returncode != 0:
        raise NetnsError(f"`{' '.join(args)}` failed: {p.stderr.strip()}")


class PacedLink:
    ADDRS = ("198.19.255.1", "198.19.255.2")

    def __init__(self, gbytes_per_s: float) -> None:
        if os.geteuid() != 0:
            raise NetnsError("a paced wire needs root (network namespaces and tc)")
        tag = uuid.uuid4().hex[:6]
        self.names = (f"hbw0-{tag}", f"hbw1-{tag}")
        self._made: list[str] = []
        rate_bits = int(gbytes_per_s * 8e9)
        burst = max(rate_bits // 8 // 250, 65536)  # at least one kernel tick's worth (HZ 250)
        try:
            for ns in self.names:
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
            _run("ip", "link", "add", f"hbwa{tag}", "netns", self.names[0], "type", "veth", "peer", "name",
                 f"hbwb{tag}", "netns", self.names[1])
            for ns, dev, addr in zip(self.names, (f"hbwa{tag}", f"hbwb{tag}"), self.ADDRS, strict=True):
                _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                     f"{rate_bits}bit", "burst", str(burst), "latency", "100ms")
        except BaseException:
            self.close()
            raise

    def prefix(self, i: int) -> list[str]:
        """argv prefix that runs a command in namespace i."""
        return ["ip", "netns", "exec", self.names[i]]

    def close(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._made.clear()

    def __enter__(self) -> "PacedLink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
