"""`hetobs dump --job ID`: make every live rank of a running job dump now.

Goes through each rank's authenticated side channel (HETOBS_SECRET must match the
job's), so it reaches ranks on other hosts and works with any rank stopped or dead;
those show up as unanswered. The job keeps running. Prints the new incident.
Exit codes: 0 every live rank dumped, 1 some rank did not answer or dump,
3 no such job (or a job directory of another user: --trust-dir), 4 I/O or internal error.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from hetobs.config import from_env
from hetobs.jobs import JobNotFound, request_dump

from ._exit_codes import ExitCode
from ._jobdir import TrustDir, checked_job_dir
from ._output import Output

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")


@app.callback(invoke_without_command=True)
def dump(
    job: Annotated[str, typer.Option("--job", help="Job id (HETOBS_JOB_ID of the job).")],
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the dumps.")] = 10.0,
    cause: Annotated[str, typer.Option("--cause", help="Text recorded as the dump's cause.")] = "hetobs dump",
    json_out: Annotated[bool, typer.Option("--json", help="Plain JSON on stdout.")] = False,
    trust_dir: TrustDir = False,
) -> None:
    """Ask every live rank of a job for a dump, without stopping it."""
    out = Output(json_mode=json_out)
    root = dir or from_env().dir
    try:
        result = request_dump(checked_job_dir(root, job, trust_dir), timeout=timeout, cause=cause,
                              trust=trust_dir)
    except JobNotFound as e:
        out.error(str(e))
        raise typer.Exit(int(ExitCode.NO_DATA)) from None
    ok = not result.unanswered and not result.missing and bool(result.files)
    data = {
        "job": job, "incident": result.incident, "asked": result.asked, "answered": result.answered,
        "unanswered": {str(k): v for k, v in result.unanswered.items()},
        "skipped": {str(k): v for k, v in result.skipped.items()},
        "files": {str(k): v for k, v in sorted(result.files.items())}, "missing": result.missing,
    }
    if not result.asked and not json_out:
        out.error("no live rank to ask (every rank exited or has no address)")
        raise typer.Exit(int(ExitCode.NO_DATA))
    if json_out:
        out.json(data)
    else:
        out.result({"incident": result.incident, "dumps": len(result.files), "asked": len(result.asked)},
                   title=f"job {job}")
        for rank, path in sorted(result.files.items()):
            out.message(f"rank {rank}: {path}")
    for rank, why in sorted(result.unanswered.items()):
        out.warning(f"rank {rank} did not answer: {why}")
    for rank in result.missing:
        out.warning(f"rank {rank} answered but wrote no dump within {timeout:g} s")
    if not result.asked:
        out.error("no live rank to ask (every rank exited or has no address)")
        raise typer.Exit(int(ExitCode.NO_DATA))
    raise typer.Exit(int(ExitCode.OK if ok else ExitCode.FAULT))
