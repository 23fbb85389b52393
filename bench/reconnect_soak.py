"""Soak: mixed collectives for a long time with a burst of TCP resets every minute (issue 28).

Two "hosts" (network namespaces, root), 2 ranks on each (shared memory inside a host, TCP
between). Every rank loops over all_reduce, reduce_scatter, all_gather, broadcast, all_to_all,
a point-to-point exchange with the rank across the hosts and a relay, checking every result
exactly. Every `--every` seconds both hosts reset every TCP segment arriving on their network
interface for `--burst` seconds (iptables REJECT --reject-with tcp-reset, as
tests/test_reset_bursts.py). At the start (after a warm-up) and at the end it samples, per rank,
open fds, threads and RSS, and the job's files in /dev/shm: flat is the target (no fd, thread,
segment or memory left behind by a reconnect). Prints one JSON object.

    .venv/bin/python bench/reconnect_soak.py --minutes 30
    .venv/bin/python bench/reconnect_soak.py --minutes 3 --every 20   # a short look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _inline import InlineJob, loop_program  # noqa: E402
from netns import Hosts, burst_results, reset_bursts  # noqa: E402

# Each round, every result checked exactly: 9 ops (an all_reduce, reduce_scatter, all_gather,
# broadcast, all_to_all, a send and a receive with the rank in the same place on the other host,
# a relay both ways, and the loop's own stop-flag all_reduce).
SETUP = """
r, w = comm.rank, comm.size
peer = (r + w // 2) % w
n = 1 << 20  # float32 elements: 4 MiB
x = np.empty(n, np.float32)
blk = np.empty(n // w, np.float32)
gat = np.empty(n // w * w, np.float32)
a2a = np.empty(n, np.float32)
got = np.empty(1 << 18, np.uint8)
def made(src, k):
    return ((np.arange(got.size, dtype=np.uint64) * 2654435761 + src * 7919 + k) & 255).astype(np.uint8)
"""
STEP = """
x[:] = r + i
comm.all_reduce(x)
assert np.all(x == w * (w - 1) // 2 + w * i), ("all_reduce", i)
x[:] = r + 1
comm.reduce_scatter(blk, x)
assert np.all(blk == w * (w + 1) // 2), ("reduce_scatter", i)
blk[:] = r + i
comm.all_gather(gat, blk)
assert all(np.all(gat[k * blk.size:(k + 1) * blk.size] == k + i) for k in range(w)), ("all_gather", i)
x[:] = (i % w) * 10 + i if r == i % w else -1
comm.broadcast(x, root=i % w)
assert np.all(x == (i % w) * 10 + i), ("broadcast", i)
x[:] = np.repeat(np.arange(w, dtype=np.float32) + 100 * r, n // w)
comm.all_to_all(a2a, x)
assert all(np.all(a2a[k * (n // w):(k + 1) * (n // w)] == r + 100 * k) for k in range(w)), ("all_to_all", i)
if r < peer:
    comm.send(made(r, i), peer)
    comm.recv(got, peer)
else:
    comm.recv(got, peer)
    comm.send(made(r, i), peer)
assert np.array_equal(got, made(peer, i)), ("p2p", i)
comm.relay([(peer, made(r, i + 7))], [(peer, got)])
assert np.array_equal(got, made(peer, i + 7)), ("relay", i)
"""
OPS_PER_ROUND = 9


def _proc(pid: int) -> dict[str, int]:
    """fds, threads and RSS (KiB) of one process, from /proc."""
    out = {"fds": len(os.listdir(f"/proc/{pid}/fd"))}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                out["rss_kib"] = int(line.split()[1])
    return out


def _sample(job: InlineJob) -> dict:
    ranks = {r: _proc(p.pid) for r, p in enumerate(job.procs)}
    pids = {str(p.pid) for p in job.procs}
    shm = [f for f in os.listdir("/dev/shm")
           if f.startswith(f"hetobs-stats-{job.job_id}-") or (f.startswith("hetobs-") and f.split("-")[1] in pids)]
    return {"ranks": ranks, "dev_shm_files": len(shm), "t": round(time.monotonic(), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between reset bursts (default 60)")
    ap.add_argument("--burst", type=float, default=0.5, help="seconds each burst lasts (default 0.5)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before the first sample (default 10)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("reconnect_soak: network namespaces need root")
    if not (args.minutes > 0 and args.every > args.burst > 0):
        sys.exit("need --minutes > 0 and --every > --burst > 0")
    tmp = Path(tempfile.mkdtemp(prefix="hetobs-soak-"))
    stop = tmp / "stop"
    load0 = os.getloadavg()
    with Hosts(2) as hosts:
        prefix = [hosts.prefix(0), hosts.prefix(0), hosts.prefix(1), hosts.prefix(1)]
        with InlineJob(loop_program(STEP, setup=SETUP, stop=str(stop)), 4, tmp,
                       env={"HETOBS_TIMEOUT": "120", "HETOBS_CONNECT_TIMEOUT": "60", "HETOBS_HANG_TIMEOUT": "120"},
                       transport="auto", master_addr=hosts.addrs[0], prefix=prefix) as job:
            job.wait_line(0, "STARTED", 120)
            t_start = time.monotonic()
            deadline = t_start + args.minutes * 60
            # The first burst comes before the first sample, so what a reconnect allocates once
            # (its first socket, a thread that stays) is in both samples and only growth shows.
            bursts: list[list[tuple[int, float]]] = []
            first = True
            start = end = None
            while time.monotonic() < deadline:
                procs = [reset_bursts(hosts, h, count=1, seconds=args.burst, gap=0) for h in (0, 1)]
                bursts.append([x for p in procs for x in burst_results(p)])
                if any(p.poll() is not None for p in job.procs):
                    break
                if first:
                    time.sleep(max(0.0, args.warmup))  # let the reconnects settle before the start sample
                    start = _sample(job)
                    first = False
                time.sleep(max(0.0, min(args.every - args.burst, deadline - time.monotonic())))
            end = _sample(job)
            stop.touch()
            runs = job.wait(300)
    out = {"minutes": round((time.monotonic() - t_start) / 60, 1), "bursts": len(bursts),
           "segments_rejected": sum(n for b in bursts for n, _ in b),
           "ranks_ok": sum(r.returncode == 0 for r in runs), "start": start, "end": end,
           "loadavg_start": [round(x, 1) for x in load0], "loadavg_end": [round(x, 1) for x in os.getloadavg()]}
    for r in runs:
        rounds = next((int(l.split()[1]) for l in r.stdout.splitlines() if l.startswith("OPS ")), None)
        links = next((json.loads(l[len("LINKS "):]) for l in r.stdout.splitlines() if l.startswith("LINKS ")), None)
        failed = next((l for l in r.stdout.splitlines() if l.startswith("FAILED")), None)
        out[f"rank{r.rank}"] = {"rc": r.returncode, "rounds": rounds,
                                "ops": rounds * OPS_PER_ROUND if rounds is not None else None,
                                "reconnects": sum(links) if links else 0,
                                "failed": failed or (r.stderr[-300:] if r.returncode else None)}
    print(json.dumps(out, indent=1))
    subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
