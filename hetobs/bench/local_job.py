"""Start N rank processes of one job on this host and collect what they print.

For benchmarks and checks that run a short job to completion (not for the test suite's
launcher, which drives ranks step by step). Each rank gets RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, one HETOBS_JOB_ID and a private HETOBS_DIR, plus its own extra variables; a
rank prints one line "RESULT <json>" that `result_of` reads back.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import uuid
from typing import Any, Mapping, Sequence
from ..ports import free_port

__all__ = ["run_local", "result_of"]


def run_local(argv: Sequence[str], rank_env: Sequence[Mapping[str, str]], timeout: float,
              env: Mapping[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Run `argv` once per entry of `rank_env` (rank r gets rank_env[r]) and wait for all."""
    port, job = free_port(), f"local-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="hetobs-local-") as tmp:
        procs = []
        for r, extra in enumerate(rank_env):
            e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(len(rank_env)), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), HETOBS_JOB_ID=job, HETOBS_DIR=os.path.join(tmp, "dir"),
                     PYTHONUNBUFFERED="1", **(env or {}), **extra)
            procs.append(subprocess.Popen(list(argv), env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, stdin=subprocess.DEVNULL))
        out = []
        for p in procs:
            try:
                so, se = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                so, se = p.communicate()
            out.append(subprocess.CompletedProcess(list(argv), p.returncode, so, se))
        return out


def result_of(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The rank's "RESULT <json>" line, or {"error": ...} with the end of its stderr."""
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return {"error": f"exit {p.returncode}: {p.stderr[-1500:]}"}
