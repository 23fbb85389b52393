"""`hetobs run [--job ID] -- CMD ...`: run a job with hetobs wired in.

Sets HETOBS_JOB_ID (given, inherited, or generated), a fresh HETOBS_SECRET (so every
handshake of this job is authenticated and no other job can talk to it), HETOBS_DIR,
and the interposer: for `mpirun`/`mpiexec` the preload is passed to the ranks (Open
MPI: `-x`, MPICH/Hydra: `-genv`), never to the launcher itself; otherwise LD_PRELOAD
is set for CMD. Then CMD replaces this process, so signals and the exit status are
the job's own.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import uuid
from typing import Annotated, List, Optional

import typer

from hetobs.config import from_env

from ._exit_codes import ExitCode
from ._output import Output

__all__ = ["run", "build_command", "CONTEXT"]

# Registered in main.py as a plain command (not a sub-app): a sub-app's callback is a
# Click group, which would read the job's command line as a subcommand name.
CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}

_MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun")


def _launcher_flavor(cmd0: str) -> str:
    """'openmpi' or 'hydra' (MPICH, Intel MPI): they export variables differently."""
    try:
        out = subprocess.run([cmd0, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "openmpi"
    return "hydra" if "HYDRA" in out or "MPICH" in out.upper() else "openmpi"


def build_command(cmd: list[str], env: dict[str, str], preload: str | None,
                  kind: str = "mpi") -> tuple[list[str], dict[str, str]]:
    """The command line and environment to exec (pure, for tests).

    For NCCL the same library is also NCCL's profiler plugin (NCCL_PROFILER_PLUGIN takes a
    path), which records per-peer proxy progress for the diagnosis.
    """
    env = dict(env)
    if not preload:
        return cmd, env
    names = ["HETOBS_JOB_ID", "HETOBS_SECRET", "HETOBS_DIR"]
    if kind == "nccl":
        env["NCCL_PROFILER_PLUGIN"] = preload
        names.append("NCCL_PROFILER_PLUGIN")
    base = os.path.basename(cmd[0])
    if base in _MPI_LAUNCHERS:
        if _launcher_flavor(cmd[0]) == "hydra":
            extra = ["-genv", "LD_PRELOAD", preload, "-genvlist", ",".join(names)]
        else:
            extra = ["-x", f"LD_PRELOAD={preload}"] + [x for n in names for x in ("-x", n)]
        return [cmd[0], *extra, *cmd[1:]], env
    env["LD_PRELOAD"] = f"{preload}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else preload
    return cmd, env


def run(
    ctx: typer.Context,
    job: Annotated[Optional[str], typer.Option("--job", help="Job id (default: HETOBS_JOB_ID, else generated).")] = None,
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    preload: Annotated[str, typer.Option("--preload", help="auto (mpi for mpirun/mpiexec), mpi, nccl or none.")
                       ] = "auto",
) -> None:
    """Run CMD (after `--`) with the job id, a fresh secret, the dump directory and the preload set."""
    out = Output()
    cmd: List[str] = list(ctx.args)
    if not cmd:
        out.error("nothing to run: give the command after `--`, e.g. hetobs run -- mpirun -np 4 ./app")
        raise typer.Exit(int(ExitCode.USAGE))
    if preload not in ("auto", "mpi", "nccl", "none"):
        out.error(f"--preload {preload!r}: expected auto, mpi, nccl or none")
        raise typer.Exit(int(ExitCode.USAGE))
    if shutil.which(cmd[0]) is None and not os.path.exists(cmd[0]):
        out.error(f"command not found: {cmd[0]}")
        raise typer.Exit(int(ExitCode.USAGE))
    settings = from_env()
    env = dict(os.environ)
    env["HETOBS_JOB_ID"] = job or env.get("HETOBS_JOB_ID") or uuid.uuid4().hex[:12]
    env["HETOBS_SECRET"] = secrets.token_hex(32)
    env["HETOBS_DIR"] = dir or settings.dir
    kind = preload
    if kind == "auto":
        kind = "mpi" if os.path.basename(cmd[0]) in _MPI_LAUNCHERS else "none"
    lib = None
    if kind != "none":
        from hetobs.preload import library_path

        lib = library_path(kind)
    argv, env = build_command(cmd, env, lib, kind)
    out.message(f"hetobs: job {env['HETOBS_JOB_ID']}; dumps under {env['HETOBS_DIR']}/{env['HETOBS_JOB_ID']}; "
                f"diagnose with: hetobs diagnose --job {env['HETOBS_JOB_ID']}")
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)
