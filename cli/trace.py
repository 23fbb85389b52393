"""`hetobs trace --job ID -o trace.json`: recorded ops as a Chrome / Perfetto trace.

Default source: the latest incident's dumps (every rank, any host, as of the
incident); `--incident` picks one; `--live` reads the record rings of the ranks on
this node instead (also the fallback when the job has no incident yet). One track per
rank and communicator, plus one per phase (vendor, d2h, wire, h2d) under a communicator
of hierarchical island ops; open the file in https://ui.perfetto.dev or chrome://tracing.

Exit codes: 0 written, 2 usage error, 3 nothing to draw (no incident, no readable
dump, no segment), 4 I/O error writing the file.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer

from hetobs.config import from_env

from ._exit_codes import ExitCode
from ._jobdir import TrustDir, checked_job_dir
from ._output import Output

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")


@app.callback(invoke_without_command=True)
def trace(
    job: Annotated[str, typer.Option("--job", help="Job id (HETOBS_JOB_ID of the job).")],
    output: Annotated[str, typer.Option("-o", "--output", help="Trace file to write ('-': stdout).")] = "trace.json",
    incident: Annotated[Optional[str], typer.Option("--incident", help="Incident id (default: the latest).")] = None,
    live: Annotated[bool, typer.Option("--live", help="Read the live record rings on this node.")] = False,
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    shm_dir: Annotated[str, typer.Option("--shm-dir", hidden=True)] = "/dev/shm",
    trust_dir: TrustDir = False,
) -> None:
    """Write a job's recorded ops as Chrome/Perfetto trace events."""
    from hetobs.exporters import trace as tr
    from hetobs.exporters.source import ShmSource

    out = Output()
    if live and incident:
        out.error("--live and --incident exclude each other")
        raise typer.Exit(int(ExitCode.USAGE))
    job_dir = checked_job_dir(dir or from_env().dir, job, trust_dir)
    try:
        if not live and incident is None:
            incident = tr.latest_incident(job_dir)
            if incident is None:
                out.message(f"job {job}: no incident in {job_dir}; reading the live record rings")
        if incident is not None and not live:
            raw, hosts, problems = tr.events_from_incident(job_dir, incident)
            source = f"incident {incident}"
        else:
            snap = ShmSource(job, shm_dir=shm_dir, job_dir=job_dir).snapshot(records=1 << 20)
            raw, hosts, problems = tr.events_from_snapshot(snap)
            source = "live record rings"
    except tr.TraceError as e:
        out.error(str(e))
        raise typer.Exit(int(ExitCode.NO_DATA)) from None
    for p in problems:
        out.warning(p)
    doc = tr.build(raw, hosts, source)
    ops = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "island_phase")
    if output == "-":
        import json

        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    else:
        try:
            tr.write(doc, output)
        except OSError as e:
            out.error(f"cannot write {output}: {e.strerror or e}")
            raise typer.Exit(int(ExitCode.INTERNAL)) from None
    where = "stdout" if output == "-" else os.path.abspath(output)
    out.message(f"{ops} ops of {len(hosts)} ranks from the {source} -> {where} (open in https://ui.perfetto.dev)")
