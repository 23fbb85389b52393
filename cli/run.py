"""`hetobs run [--job ID] -- CMD ...`: run a job with hetobs wired in.

Sets HETOBS_JOB_ID (--job, else the settings' id: HETOBS_JOB_ID, SLURM_JOB_ID with the step,
TORCHELASTIC_RUN_ID; else generated), HETOBS_DIR, HETOBS_SECRET and the interposer: for
`mpirun`/`mpiexec` the preload is passed to the ranks (Open MPI: `-x`, MPICH/Hydra:
`-genv`), never to the launcher itself; otherwise LD_PRELOAD is set for CMD. Then CMD
replaces this process, so signals and the exit status are the job's own.

The secret: a given HETOBS_SECRET is kept. Else a fresh one authenticates every handshake
of the job (no other job can talk to it) and is stored in the job directory (0600, the
directory 0700 and checked as the ranks check it), where `hetobs dump` and `diagnose` of
the same user find it. Run inside an allocation but outside a step (a batch script that
then calls srun), the id is SLURM_JOB_ID, or SLURM_JOB_ID.runN when an earlier `hetobs
run` of the allocation has it: one id per launched job. Run as one task of many (`srun
hetobs run -- ...`, `mpirun hetobs run -- ...`), each copy would make a different secret
the ranks could not agree on, so none is made (handshakes are keyed by the job id) and an
id is set only when the launcher gives one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from typing import Annotated, List, Optional

import typer

from hetobs.config import Settings, from_env, launch_from_env
from hetobs.jobs import job_path, make_job_dir, store_secret
from hetobs.ownership import UntrustedJobDir

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


def _claim_job_id(settings: Settings, root: str) -> str:
    """The job id for one launch: the settings' id, made unique per launch inside an allocation.

    SLURM_JOB_ID outside a step names the allocation, which may launch several jobs one after
    another; the first takes the id, each later one the first free SLURM_JOB_ID.runN (its
    directory made now, so two launches at once cannot take the same one).
    """
    if settings.job_id_from != "SLURM_JOB_ID":
        return settings.job_id
    for n in range(10000):
        candidate = settings.job_id if n == 0 else f"{settings.job_id}.run{n}"
        if make_job_dir(job_path(root, candidate)):
            return candidate
    raise OSError(f"{root}: 10000 jobs of allocation {settings.job_id} already")


def run(
    ctx: typer.Context,
    job: Annotated[Optional[str], typer.Option("--job", help="Job id (default: HETOBS_JOB_ID, SLURM_JOB_ID[.step], "
                                                             "TORCHELASTIC_RUN_ID, else generated).")] = None,
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    preload: Annotated[str, typer.Option("--preload", help="auto (mpi for mpirun/mpiexec), mpi, nccl or none.")
                       ] = "auto",
) -> None:
    """Run CMD (after `--`) with the job id, a secret (stored for the job's owner), the dump directory and the
    preload set."""
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
    env["HETOBS_DIR"] = root = dir or settings.dir
    launch = launch_from_env()
    one_task_of = launch.world_size if launch.source and (launch.world_size or 1) > 1 else None
    try:
        if one_task_of:
            if job or not settings.job_id_generated:
                env["HETOBS_JOB_ID"] = job or settings.job_id
        else:
            job_id = env["HETOBS_JOB_ID"] = job or _claim_job_id(settings, root)
            if not settings.secret:
                env["HETOBS_SECRET"] = store_secret(job_path(root, job_id), secrets.token_hex(32))
    except UntrustedJobDir as e:
        out.error(str(e))
        raise typer.Exit(int(ExitCode.USAGE)) from None
    except OSError as e:
        out.error(f"cannot prepare the job directory under {root}: {e.strerror or e} (is HETOBS_DIR / --dir right?)")
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
    kind = preload
    if kind == "auto":
        kind = "mpi" if os.path.basename(cmd[0]) in _MPI_LAUNCHERS else "none"
    lib = None
    if kind != "none":
        from hetobs.preload import library_path

        lib = library_path(kind)
    argv, env = build_command(cmd, env, lib, kind)
    if one_task_of:
        if launch.rank == 0 and not settings.secret:  # once per job, not once per task
            out.warning(f"hetobs run is one of {one_task_of} tasks here ({launch.source}): no secret made, since "
                        "the tasks could not agree on one (handshakes are keyed by the job id); set HETOBS_SECRET, "
                        "or start hetobs run once, around the launcher")
    else:
        out.message(f"hetobs: job {job_id}; dumps under {root}/{job_id}; diagnose with: hetobs diagnose --job {job_id}")
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)
