"""One source for codes, names, the stats layout version and the busbw factor: `_core`.

The Python side takes them from the native module (hetobs/codes.py) instead of typing them
again; these tests check that every Python user holds the native values, and that the bus
bandwidth factor is one rule everywhere (the recorder, the exporters, the benchmark), the
one-rank all_gather included (0, as nccl-tests: nothing crosses a bus).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from hetobs import buffers, codes, comm, stats


def test_codes_are_the_native_tables(core: Any) -> None:
    assert codes.OP_KINDS == tuple(core.OP_KINDS) and codes.OP_KINDS[0] == "all_reduce"
    assert codes.OP_KINDS[codes.OP_CODES["relay"]] == "relay" and len(codes.OP_KINDS) == 12
    assert codes.BACKENDS == ("native", "gloo", "nccl", "mpi", "islands", "vendor")
    assert codes.DEVICE_TYPES == ("cpu", "cuda", "other")
    assert codes.DTYPES[codes.DTYPE_CODES["bfloat16"]] == "bfloat16"
    assert dict(zip(codes.DTYPES, codes.DTYPE_SIZES))["float64"] == 8
    assert codes.REDUCTIONS[-1] == "other" and codes.OP_STATES[-1] == "failed"
    assert codes.STATS_LAYOUT_VERSION == core.STATS_LAYOUT_VERSION


def test_python_users_hold_the_native_codes() -> None:
    assert stats.VERSION == codes.STATS_LAYOUT_VERSION and stats.OP_KINDS == codes.OP_KINDS
    assert (stats.LATENCY_BUCKETS, stats.BANDWIDTH_BUCKETS) == (codes.LATENCY_BUCKETS, codes.BANDWIDTH_BUCKETS)
    assert buffers.DTYPES == codes.DTYPE_CODES
    # The native transport runs every kind but the two recorded for vendor libraries only.
    assert set(codes.OP_CODES) - set(comm.OPS) == {"gather", "scatter"}
    assert all(codes.OP_CODES[name] == code for name, code in comm.OPS.items())
    assert set(codes.REDUCTION_CODES) - set(comm.REDUCTIONS) == {"other"}


def test_the_stats_reader_knows_the_layout_the_core_writes() -> None:
    assert stats._OP_KINDS_OF_VERSION[codes.STATS_LAYOUT_VERSION] == len(codes.OP_KINDS)


def test_torch_users_hold_the_native_codes() -> None:
    pytest.importorskip("torch")
    from hetobs.islands import backend, vendor
    from hetobs.torch import _common, python_wrapper, wrapped_backend

    assert backend.ISLANDS_BACKEND_CODE == codes.BACKENDS.index("islands")
    assert vendor._VENDOR_CODE == codes.BACKENDS.index("vendor")
    assert vendor._INSTRUMENTED == {"gloo": 1, "nccl": 2}
    assert [vendor.device_code(d) for d in ("cpu", "cuda", "npu", "standin")] == [0, 1, 2, 2]
    assert wrapped_backend._BACKEND_CODES == {"gloo": 1, "nccl": 2, "mpi": 3}
    assert _common._OTHER == codes.REDUCTIONS.index("other")
    assert python_wrapper._OP_CODES["gather"] == codes.OP_KINDS.index("gather")


def _nccl_tests(op: str, n: int) -> float:
    # nccl-tests src/*.cu getBw: all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall,
    # gather, scatter (n-1)/n; broadcast, reduce, sendrecv 1.
    scaled = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0, "gather": 1.0,
              "scatter": 1.0}
    return scaled[op] * (n - 1) / n if op in scaled else 1.0


@pytest.mark.parametrize("n", [1, 2, 3, 8, 1000])
def test_busbw_factor_is_one_rule_everywhere(n: int) -> None:
    from hetobs.bench import bus_factor
    from hetobs.exporters import metrics

    for op in codes.OP_KINDS:
        want = _nccl_tests(op, n)
        assert codes.busbw_factor(op, n) == pytest.approx(want, abs=1e-15), op
        assert metrics.busbw_factor(op, n) == codes.busbw_factor(op, n), op
        assert bus_factor(op, n) == codes.busbw_factor(op, n), op


def test_one_rank_all_gather_has_no_bus_bandwidth() -> None:
    # The value that used to disagree: 1.0 in the recorder and the exporters, 0.0 in the benchmark.
    from hetobs.bench import bus_factor
    from hetobs.exporters import metrics

    assert codes.busbw_factor("all_gather", 1) == metrics.busbw_factor("all_gather", 1) == 0.0
    assert bus_factor("all_gather", 1) == 0.0
    assert codes.busbw_factor("broadcast", 1) == 1.0
    with pytest.raises(ValueError, match="op=bogus"):
        codes.busbw_factor("bogus", 2)


_ONE_RANK = """
import json, sys, numpy as np, hetobs
comm = hetobs.init()
x = np.ones(1 << 16, np.float32)
comm.all_gather(np.empty_like(x), x)
comm.all_reduce(x)
recs = [r for r in hetobs._core.records() if r["op"] in ("all_gather", "all_reduce")]
print(json.dumps([(r["op"], r["algbw_gbps"], r["busbw_gbps"]) for r in recs]))
"""


def test_the_recorder_applies_the_same_factor(core: Any, tmp_path: Path) -> None:
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1",
               HETOBS_JOB_ID=f"codes{uuid.uuid4().hex[:8]}", HETOBS_DIR=str(tmp_path), HETOBS_DEBUG="ERROR")
    out = subprocess.run([sys.executable, "-c", _ONE_RANK], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(op for op, _, _ in rows) == ["all_gather", "all_reduce"], rows
    for op, algbw, busbw in rows:
        assert algbw > 0 and busbw == 0.0, (op, algbw, busbw)
