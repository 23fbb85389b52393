"""The 8 B all_reduce's short path (issue 15): a blocking op reads the clock once for its
enqueue and start times, the numpy fast path (a plain C function, no pybind11 dispatch) takes
any spelling of the reduction, keeps results exact and raises hetobs's own errors. Two real
ranks over shared memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _inline import InlineJob

pytestmark = pytest.mark.slow

BODY = r"""
import json, numpy as np, hetobs
comm = hetobs.init()
n, r = comm.size, comm.rank
x = np.full(2, r + 1, dtype=np.float32)
comm.all_reduce(x)                             # default op: the interned "sum"
comm.all_reduce(x, "".join(["s", "um"]))       # the same name, not the same string object
y = np.full(2, r + 1, dtype=np.int64)
comm.all_reduce(y, op="max")
z = np.full(2, r + 1, dtype=np.float32)
comm.all_reduce(z, async_op=True).wait()
recs = [rec for rec in comm.records() if rec.get("op") == "all_reduce"]
times = [[rec["time_created_ns"], rec["time_discovered_started_ns"], rec["state"]] for rec in recs]
comm.close()
try:  # the fast path's native error surfaces as hetobs's own exception class, message intact
    comm.all_reduce(x)
    closed = None
except hetobs.errors.HetobsError as e:
    closed = [type(e).__name__, str(e)]
print(json.dumps({"x": x.tolist(), "y": y.tolist(), "z": z.tolist(), "times": times, "closed": closed}))
"""


def test_blocking_small_all_reduce_records_one_start_time_and_stays_exact(core: Any, tmp_path: Path) -> None:
    with InlineJob(BODY, 2, tmp_path) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["x"] == [6.0, 6.0] and out["y"] == [2, 2] and out["z"] == [3.0, 3.0], (r.rank, out)
        times = out["times"]
        assert [t[2] for t in times] == ["completed"] * 4, (r.rank, times)
        # Blocking ops start as they are enqueued: one clock read serves both times.
        assert [t[0] == t[1] for t in times[:3]] == [True] * 3, (r.rank, times)
        assert times[3][0] <= times[3][1], (r.rank, times)  # the async op may wait in the queue
        assert out["closed"] and out["closed"][0] == "HetobsError" and "is closed" in out["closed"][1], out
