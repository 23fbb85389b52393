"""torch's own distributed tests on the hetobs backends, beside Gloo: a few-minute subset.

The full run is the bench (bench/torch_conformance.py, table in docs/conformance.md); this
subset keeps the regressions it found fixed: new groups of all ranks (`*_full_group`,
each rank once held a different generated job id), coalesced all_gather (once "No backend
type associated with device type cpu"), direct calls without options (`get_future`), destroying
a new group ("ProcessGroup name not set"), DDP's logging data naming the backend (once
"custom"), and a test of most CPU op families. Every test Gloo passes here, `hetobs_gloo`,
`hetobs` and `hetobs_islands` must pass too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest", reason="torch's distributed tests need expecttest (pip install expecttest)")
pytest.importorskip("hypothesis", reason="torch's distributed tests need hypothesis (pip install hypothesis)")

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).resolve().parents[1] / "bench" / "torch_conformance.py"
SUBSET = [
    "test_all_reduce_full_group_sum$", "test_broadcast_full_group$", "test_all_gather_full_group$",
    "test_all_gather_coalesced_simple$", "test_all_reduce_coalesced_sum$", "test_reduce_sum$", "test_gather$",
    "test_scatter_full_group$", "test_send_recv$", "test_barrier_full_group$", "test_get_future$",
    "test_destroy_group$", "test_ddp_logging_data_cpu$",
]


def test_hetobs_backends_pass_what_gloo_passes(tmp_path: Path) -> None:
    out = tmp_path / "conformance.json"
    argv = [sys.executable, str(RUNNER), "--backends", "gloo,hetobs_gloo,hetobs,hetobs_islands", "--wide", "0", "--quiet", "--json",
            str(out)]
    for p in SUBSET:
        argv += ["-k", p]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    gloo = doc["runs"][0]["outcomes"]
    assert len(gloo) == len(SUBSET), sorted(gloo)  # each pattern names exactly one test
    assert {name: o for name, o in gloo.items() if o["outcome"] != "passed"} == {}
    assert doc["gaps"] == {"hetobs_gloo": {}, "hetobs": {}, "hetobs_islands": {}}, json.dumps(doc["gaps"], indent=1)
