"""One rank of the demo job (`python -m hetobs.demo.rank`), configured by environment:

HETOBS_DEMO_FAULT   none | kill | stop | sleep | mismatch | link | deadlock | slow
HETOBS_DEMO_CULPRIT the rank that misbehaves
HETOBS_DEMO_AT      the op (0-based) at which it does
HETOBS_DEMO_OPS     ops per rank in a healthy run

Each rank prints "READY <json>" (its links, with socket addresses) once connected, and
"OPS <n>" when it finishes. Faults are real: signals to itself, a Python sleep, a wrong
count, a firewall rule (set by the runner), two communicators waiting on each other.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import hetobs


def preparing_next_batch(seconds: float) -> None:
    """Stands for a rank busy in Python (data loading, a slow step) instead of in the collective."""
    time.sleep(seconds)


def main() -> int:
    fault = os.environ.get("HETOBS_DEMO_FAULT", "none")
    culprit = int(os.environ.get("HETOBS_DEMO_CULPRIT", "1"))
    at = int(os.environ.get("HETOBS_DEMO_AT", "5"))
    ops = int(os.environ.get("HETOBS_DEMO_OPS", "20"))
    comm = hetobs.init()
    r, n = comm.rank, comm.size
    other = comm.new_group(list(range(n))) if fault == "deadlock" else None
    x = np.ones(256 * 1024, np.float32)
    comm.all_reduce(x)  # TCP peers connect on first use: the ring's links exist before READY names them
    links = [{k: link[k] for k in ("peer", "transport", "local_address", "remote_address")} for link in comm.links()]
    print("READY " + json.dumps({"rank": r, "pid": os.getpid(), "links": links}), flush=True)
    x = np.ones(256 * 1024, np.float32)
    done = 0
    try:
        for i in range(ops):
            if i == at and r == culprit:
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif fault == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif fault == "sleep":
                    preparing_next_batch(3600)
                elif fault == "mismatch":
                    comm.all_reduce(np.ones(x.size + 1, np.float32))
                    continue
                elif fault == "deadlock":
                    assert other is not None
                    other.all_reduce(np.ones(16, np.float32))  # the others are in the world's op
                    continue
            if fault == "link" and i == at and r == 0:
                # The runner drops one ring connection now; wait until it has.
                sys.stdin.readline()
            if fault == "slow" and r == culprit:
                time.sleep(0.02)  # a 3x slower rank that still makes progress
            x[:] = 1
            comm.all_reduce(x)
            if not np.all(x == n):
                raise AssertionError(f"rank {r}: wrong all_reduce result {x[:4]}")
            done += 1
    except hetobs.HetobsError as e:
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        return 1
    print(f"OPS {done}", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
