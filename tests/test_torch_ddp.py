"""DDP under torchrun, unchanged but for the backend name: "hetobs_gloo" trains exactly
what "gloo" trains (2 ranks), and every op DDP ran (its initial parameter broadcast, the
gradient all_reduce of each step, which it completes through the future and never waits
on) is recorded and ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

PROGRAM = Path(__file__).with_name("torch_ddp_program.py")
STEPS = 6


def torchrun(backend: str, tmp_path: Path) -> list[dict]:
    env = dict(os.environ, TORCH_BACKEND=backend, HETOBS_DIR=str(tmp_path / "hetobs"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--tee", "3", str(PROGRAM)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # torchrun prefixes each rank's lines with "[default<rank>]:".
    results = {}
    for line in proc.stdout.splitlines():
        prefix, _, rest = line.partition("]:")
        if rest.startswith("RESULT "):
            results[int(prefix.rsplit("default", 1)[1])] = json.loads(rest[len("RESULT "):])
    assert sorted(results) == [0, 1], proc.stdout[-3000:]
    return [results[0], results[1]]


@pytest.mark.slow
def test_ddp_under_torchrun_trains_the_same_and_is_recorded(tmp_path: Path) -> None:
    plain = torchrun("gloo", tmp_path / "gloo")
    ours = torchrun("hetobs_gloo", tmp_path / "hetobs_gloo")
    assert ours[0]["params"] == plain[0]["params"] == ours[1]["params"]
    for rank, run in enumerate(ours):
        recs = run["records"]
        assert [r for r in recs if r[1] != "completed"] == [], f"rank {rank}: {recs}"
        ops = [op for op, _ in recs]
        assert "broadcast" in ops, ops  # DDP's initial parameter sync
        assert ops.count("all_reduce") == STEPS, ops  # one bucket per step
