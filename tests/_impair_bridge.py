"""A user-space netem for one direction of one link (this kernel has no netem qdisc).

Runs inside the switch namespace of tests/netns.py, between two tap devices: `--a` sits on the
switch's bridge, `--b` on a bridge of its own with one host's switch port, so every frame to and
from that host passes through here. Frames are forwarded both ways; IPv4 frames from `--src` to
`--dst` are dropped with probability `--loss` and the rest held for `--delay` +- `--jitter`
seconds (uniform), like `tc qdisc ... netem delay 50ms 20ms loss 5%` on the egress toward `--dst`
of that one address pair. Jitter reorders frames, as netem's does. Everything else passes at once.

On SIGTERM it prints one JSON line of counts ({"impaired", "dropped", "passed"}) and exits, so
a test can check the fault really met its traffic. Standard library only.
"""

from __future__ import annotations

import argparse
import fcntl
import heapq
import ipaddress
import json
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
ETH_IPV4 = b"\x08\x00"


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--dst", required=True)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=28)
    args = ap.parse_args()
    if not (0 <= args.loss < 1 and args.delay >= 0 and 0 <= args.jitter <= args.delay):
        sys.exit("need 0 <= loss < 1 and 0 <= jitter <= delay")
    pair = (ipaddress.IPv4Address(args.src).packed, ipaddress.IPv4Address(args.dst).packed)
    rng = random.Random(args.seed)
    fa, fb = open_tap(args.a), open_tap(args.b)
    other = {fa: fb, fb: fa}
    held: list[tuple[float, int, int, bytes]] = []  # (due, order, out fd, frame)
    counts = {"impaired": 0, "dropped": 0, "passed": 0}
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("READY", flush=True)
    order = 0
    while not stop:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else 0.5
        try:
            ready, _, _ = select.select([fa, fb], [], [], timeout)
        except InterruptedError:
            continue
        for fd in ready:
            while True:
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not frame:
                    break
                if frame[12:14] == ETH_IPV4 and (frame[26:30], frame[30:34]) == pair:
                    counts["impaired"] += 1
                    if rng.random() < args.loss:
                        counts["dropped"] += 1
                        continue
                    due = time.monotonic() + args.delay + rng.uniform(-args.jitter, args.jitter)
                    order += 1
                    heapq.heappush(held, (due, order, other[fd], frame))
                    continue
                counts["passed"] += 1
                try:
                    os.write(other[fd], frame)
                except OSError:
                    pass  # the other tap is gone or full: a lost frame, as on a wire
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, out, frame = heapq.heappop(held)
            try:
                os.write(out, frame)
            except OSError:
                pass
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
