"""What a TCP reset costs a job, and what acknowledged sends cost (docs/reconnect.md).

Two "hosts" (network namespaces, root), 2 ranks, a loop of 16 MiB all_reduces over TCP:
per-op times with no fault, and with one second of resets (iptables REJECT --reject-with
tcp-reset on host 1) injected mid-loop. Then, on one host over loopback TCP, median op
times with reconnect on (sends complete on ack) and off (HETOBS_RECONNECT_TIMEOUT=0).

    sudo .venv/bin/python bench/reconnect_cost.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _inline import InlineJob  # noqa: E402
from netns import Hosts  # noqa: E402

LOOP = """
import os, time, numpy as np, hetobs
stop = {stop!r}
comm = hetobs.init()
x = np.empty({n}, np.float32)
flag = np.zeros(1, np.float32)
times, i = [], 0
while True:
    x[:] = 1
    t0 = time.monotonic()
    comm.all_reduce(x)
    times.append(time.monotonic() - t0)
    assert np.all(x == 2)
    if i == 0:
        print("STARTED", flush=True)
    flag[0] = float(os.path.exists(stop)) if {until_stop} else float(i + 1 >= {ops})
    comm.all_reduce(flag, op="max")
    i += 1
    if flag[0]:
        break
if comm.rank == 0:
    print("TIMES", " ".join(f"{{t:.4f}}" for t in times), flush=True)
    print("RECONNECTS", sum(l["reconnects"] for l in comm.links()), flush=True)
"""


def _times(out: str) -> list[float]:
    return [float(t) for t in next(l for l in out.splitlines() if l.startswith("TIMES ")).split()[1:]]


def faulted(tmp: Path, reset: bool) -> tuple[list[float], str]:
    stop = tmp / "stop"
    body = LOOP.format(stop=str(stop), n=4 << 20, until_stop=True, ops=0)
    with Hosts(2) as hosts:
        with InlineJob(body, 2, tmp, env={"HETOBS_TIMEOUT": "60"}, transport="tcp", master_addr=hosts.addrs[0],
                       prefix=[hosts.prefix(0), hosts.prefix(1)]) as job:
            while not job.procs[0].stdout.readline().startswith("STARTED"):  # type: ignore[union-attr]
                pass
            time.sleep(1.0)
            if reset:
                rule = ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"]
                for chain in ("INPUT", "OUTPUT"):
                    hosts.run(1, "iptables", "-I", chain, *rule)
                time.sleep(1.0)
                for chain in ("INPUT", "OUTPUT"):
                    hosts.run(1, "iptables", "-D", chain, *rule)
            time.sleep(1.0)
            stop.touch()
            runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-1500:] for r in runs]
    rec = next(l for l in runs[0].stdout.splitlines() if l.startswith("RECONNECTS "))
    return _times(runs[0].stdout), rec


def loopback(tmp: Path, n: int, ops: int, reconnect: str) -> float:
    body = LOOP.format(stop="", n=n, until_stop=False, ops=ops)
    with InlineJob(body, 2, tmp, env={"HETOBS_RECONNECT_TIMEOUT": reconnect}, transport="tcp") as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-1500:] for r in runs]
    return statistics.median(_times(runs[0].stdout)[3:])


def main() -> None:
    print(f"load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as d:
        base, _ = faulted(Path(d) / "a", reset=False)
        hit, rec = faulted(Path(d) / "b", reset=True)
        print(f"16 MiB all_reduce, 2 hosts: no fault: median {statistics.median(base) * 1e3:.1f} ms, "
              f"slowest {max(base) * 1e3:.1f} ms ({len(base)} ops)")
        print(f"  1 s of resets: median {statistics.median(hit) * 1e3:.1f} ms, slowest (the op the resets hit) "
              f"{max(hit) * 1e3:.1f} ms ({len(hit)} ops), {rec}")
        for n, ops in ((1024, 400), (4 << 20, 30)):
            on = loopback(Path(d) / f"on{n}", n, ops, "30")
            off = loopback(Path(d) / f"off{n}", n, ops, "0")
            print(f"loopback TCP all_reduce {n * 4} B: median {on * 1e6:.0f} us with reconnect (acked sends), "
                  f"{off * 1e6:.0f} us with HETOBS_RECONNECT_TIMEOUT=0")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
