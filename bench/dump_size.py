"""Rank 0's dump + rank file size against the world size, with the same records (issue 14 item 1).

Each job runs N real rank processes on the native transport (shared memory), every rank
doing the same number of ring-sized all_reduces (above HETOBS_SMALL_BYTES, so the ring
algorithm runs and each rank exchanges data with its two ring neighbours only); then rank 0
dumps itself on its control socket and reports the size of that dump and of its rank file.
The ratio of the largest world's total to the smallest's is the number to watch: it should
not grow with the world (target: 48 ranks within 1.1x of 4).

    .venv/bin/python bench/dump_size.py                    # 4 and 48 ranks, 200 records
    .venv/bin/python bench/dump_size.py --sizes 4,16 --records 50
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from hetobs.ports import free_port

# The rank program: OPS all_reduces of COUNT floats, then rank 0 dumps itself and prints sizes.
RANK_BODY = """
import json, os, socket, sys
import numpy as np
import hetobs
from hetobs import _core
ops, count = int(os.environ["DS_OPS"]), int(os.environ["DS_COUNT"])
comm = hetobs.init()
x = np.ones(count, np.float32)
for _ in range(ops):
    comm.all_reduce(x)
if comm.rank == 0:
    info = _core.runtime_info()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(info["control_socket"])
        s.sendall(b"dump dump_size\\n")
        reply = s.makefile().readline().split()
    assert reply[0] == "ok", reply
    dump = reply[2]
    rank_file = os.path.join(info["job_dir"], "ranks", "rank-0.json")
    print("DUMP_SIZE " + json.dumps({"dump": dump, "dump_bytes": os.path.getsize(dump),
                                     "rank_file_bytes": os.path.getsize(rank_file)}), flush=True)
comm.barrier()  # the others stay until rank 0 has dumped: the links it reports are all alive
"""


def measure(world: int, records: int, root: Path, count: int = 32768, timeout: float = 300.0) -> dict:
    """Run one job of `world` ranks; rank 0's dump and rank file sizes (bytes)."""
    job = f"ds{uuid.uuid4().hex[:10]}"
    port = str(free_port())
    procs = []
    try:
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       HETOBS_JOB_ID=job, HETOBS_DIR=str(root), HETOBS_TRANSPORT="shm", HETOBS_RECORDS=str(records),
                       HETOBS_TIMEOUT="120", HETOBS_CONNECT_TIMEOUT="120", HETOBS_DEBUG="WARN", OMP_NUM_THREADS="1",
                       DS_OPS=str(records), DS_COUNT=str(count))
            env.pop("HETOBS_SECRET", None)
            procs.append(subprocess.Popen([sys.executable, "-c", RANK_BODY], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True))
        end = time.monotonic() + timeout
        outs = [p.communicate(timeout=max(0.1, end - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
        for name in os.listdir("/dev/shm"):
            if name.startswith(f"hetobs-stats-{job}-"):
                os.unlink(os.path.join("/dev/shm", name))
    bad = [(r, p.returncode, outs[r][1][-400:]) for r, p in enumerate(procs) if p.returncode]
    if bad:
        raise RuntimeError(f"{world} ranks: rank(s) failed: {bad[:3]}")
    line = next(ln for ln in outs[0][0].splitlines() if ln.startswith("DUMP_SIZE "))
    got = json.loads(line[len("DUMP_SIZE "):])
    got["total_bytes"] = got["dump_bytes"] + got["rank_file_bytes"]
    comm_files = sorted((root / job / "comms").glob("comm-*.json")) if (root / job / "comms").exists() else []
    got["comm_file_bytes"] = sum(f.stat().st_size for f in comm_files)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,48", help="world sizes, comma-separated (default 4,48)")
    ap.add_argument("--records", type=int, default=200, help="op records per rank (default 200)")
    ap.add_argument("--count", type=int, default=32768, help="floats per all_reduce (default 32768 = 128 KiB)")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetobs-dumpsize-") as tmp:
        for n in sizes:
            rows.append((n, measure(n, a.records, Path(tmp), a.count)))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (shared machine)")
    print(f"{'ranks':>6} {'dump B':>9} {'rank file B':>12} {'total B':>9} {'vs first':>9} {'comm files B':>13}")
    base = rows[0][1]["total_bytes"]
    for n, g in rows:
        print(f"{n:>6} {g['dump_bytes']:>9} {g['rank_file_bytes']:>12} {g['total_bytes']:>9} "
              f"{g['total_bytes'] / base:>8.3f}x {g['comm_file_bytes']:>13}")


if __name__ == "__main__":
    main()
