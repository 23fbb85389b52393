"""Run N rank processes of one short job on this host to the end and collect what they print.

For benchmarks and checks that run a short job to completion (bench/islands_reduce_scatter.py,
tests/nccl/islands_gpu_check.py), on hetobs.launch_local: each rank gets torchrun's
variables, one HETOBS_JOB_ID and a private HETOBS_DIR, plus its own extra variables; a
rank prints one line "RESULT <json>" that `result_of` reads back.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..launch_local import LocalJob, new_job_id

__all__ = ["run_local", "result_of"]


def run_local(argv: Sequence[str], rank_env: Sequence[Mapping[str, str]], timeout: float,
              env: Mapping[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Run `argv` once per entry of `rank_env` (rank r gets rank_env[r]) and wait for all, at most
    `timeout` seconds; ranks still running then are killed (their return code says so)."""
    with tempfile.TemporaryDirectory(prefix="hetobs-local-") as tmp:
        job = LocalJob(argv, len(rank_env), log_dir=tmp, hetobs_dir=Path(tmp, "dir"), job_id=new_job_id("local-"),
                       env=env, rank_env=dict(enumerate(rank_env)))
        with job:
            job.wait(timeout)
        return [subprocess.CompletedProcess(list(argv), p.returncode,
                                            job.log_path(r, "out").read_text(errors="replace"),
                                            job.log_path(r, "err").read_text(errors="replace"))
                for r, p in enumerate(job.procs)]


def result_of(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The rank's "RESULT <json>" line, or {"error": ...} with the end of its stderr."""
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return {"error": f"exit {p.returncode}: {p.stderr[-1500:]}"}
