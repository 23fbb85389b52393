"""A hang under the instrumented Gloo backend ("hetobs_gloo") is dumped by the watchdog
and diagnosed like a native one: the rank stuck in Python is named, with its stack. Both
the C++ wrapper (hetobs._torch_ext) and the Python fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _inline import InlineJob
from hetobs.diagnosis import Options, diagnose

pytest.importorskip("torch")

BODY = """
import time, torch, torch.distributed as dist
import hetobs
def loading_the_next_batch():
    time.sleep(4)
dist.init_process_group("hetobs_gloo")
x = torch.ones(1000)
for i in range(6):
    if i == 3 and dist.get_rank() == 1:
        loading_the_next_batch()
    dist.all_reduce(x)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("wrapper", ["native", "python"])
def test_hang_under_the_gloo_wrapper_names_the_sleeping_rank(tmp_path: Path, wrapper: str) -> None:
    env = {"HETOBS_HANG_TIMEOUT": "1", "HETOBS_TORCH_NATIVE": "1" if wrapper == "native" else "0"}
    with InlineJob(BODY, 3, tmp_path, env=env) as job:
        runs = job.wait(90)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-1500:] for r in runs]
    report = diagnose(Options(job_dir=job.dir / job.job_id))
    data = json.loads(report.to_json())
    assert data["status"] == "fault", data
    top = data["verdicts"][0]
    assert (top["kind"], top["ranks"], top["op"]) == ("rank_not_joined", [1], "all_reduce"), data["verdicts"]
    assert any("loading_the_next_batch" in e for e in top["evidence"]), top["evidence"]
