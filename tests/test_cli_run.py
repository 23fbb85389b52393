"""`hetobs run`: what it hands the job (pure), and an MPI job under it end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hetobs.cli.run import build_command

PROGRAM = r"""
#include <mpi.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  double x = 1, y = 0;
  for (int i = 0; i < 3; ++i) MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return y == 2.0 ? 0 : 1;
}
"""


def test_plain_command_gets_ld_preload_prepended() -> None:
    argv, env = build_command(["./train"], {"LD_PRELOAD": "/other.so"}, "/lib/libhetobs_mpi.so")
    assert argv == ["./train"] and env["LD_PRELOAD"] == "/lib/libhetobs_mpi.so:/other.so"


def test_nccl_preload_is_also_the_profiler_plugin() -> None:
    _, env = build_command(["torchrun", "t.py"], {}, "/lib/libhetobs_nccl.so", "nccl")
    assert env["NCCL_PROFILER_PLUGIN"] == env["LD_PRELOAD"] == "/lib/libhetobs_nccl.so"


@pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun (scripts/setup.sh installs openmpi-bin)")
def test_open_mpi_launcher_passes_the_preload_to_the_ranks_not_itself() -> None:
    argv, env = build_command(["mpirun", "-np", "2", "./app"], {}, "/lib/libhetobs_mpi.so")
    assert "LD_PRELOAD" not in env
    assert argv[:3] == ["mpirun", "-x", "LD_PRELOAD=/lib/libhetobs_mpi.so"]
    assert argv[-3:] == ["-np", "2", "./app"] and "HETOBS_SECRET" in argv


@pytest.mark.skipif(not (shutil.which("mpicc") and shutil.which("mpirun")), reason="no MPI toolchain")
def test_mpi_job_under_hetobs_run(tmp_path: Path) -> None:
    src = tmp_path / "app.c"
    src.write_text(PROGRAM)
    subprocess.run(["mpicc", "-o", str(tmp_path / "app"), str(src)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETOBS_")}
    run = subprocess.run([sys.executable, "-m", "hetobs.cli", "run", "--job", "runjob", "--dir", str(tmp_path / "d"),
                          "--", "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", str(tmp_path / "app")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "hetobs: job runjob" in run.stderr
    for r in (0, 1):
        meta = json.loads((tmp_path / "d" / "runjob" / "ranks" / f"rank-{r}.json").read_text())
        assert meta["exited_cleanly"] is True and meta["comms"][0]["backend"] == "mpi"
