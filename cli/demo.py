"""`hetobs demo [--fault sleep|kill|stop|mismatch|link|deadlock|slow|none]`: the whole product
on one machine in under a minute — a 4-rank job on the native transport, one injected
fault, the watchdog firing, the dumps, and the diagnosis printed (`--html FILE`: also as
one self-contained page to look at).

Exit codes: 0 when the diagnosis names exactly the injected fault (or calls a healthy
run healthy), 1 when it does not, 4 when the demo could not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from hetobs.demo import FAULTS
from hetobs.demo.runner import DemoError, run_demo
from hetobs.diagnosis import Options

from ._exit_codes import ExitCode
from ._output import Output
from .diagnose import render, write_html

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")


@app.callback(invoke_without_command=True)
def demo(
    fault: Annotated[str, typer.Option("--fault", help=f"One of: {', '.join(FAULTS)}.")] = "sleep",
    ranks: Annotated[int, typer.Option("--ranks", min=2, max=16, help="Ranks in the demo job.")] = 4,
    culprit: Annotated[Optional[int], typer.Option("--culprit", help="The rank that misbehaves (default 1).")] = None,
    hang_timeout: Annotated[float, typer.Option("--hang-timeout", min=0.5,
                                                help="HETOBS_HANG_TIMEOUT of the demo job, seconds.")] = 2.0,
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the diagnosis as plain JSON on stdout.")] = False,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write the incident as one self-contained "
                                                                "HTML page to this file.")] = None,
) -> None:
    """Run a local job with an injected fault and diagnose it."""
    from hetobs.config import from_env

    out = Output(json_mode=json_out)
    if fault not in FAULTS:
        out.error(f"--fault {fault!r}: expected one of {', '.join(FAULTS)}")
        raise typer.Exit(int(ExitCode.USAGE))
    who = 1 if culprit is None else culprit
    if not 0 <= who < ranks:
        out.error(f"--culprit {who}: expected a rank in [0, {ranks})")
        raise typer.Exit(int(ExitCode.USAGE))
    if html is not None and not html.expanduser().parent.is_dir():
        out.error(f"--html {html}: the folder {html.expanduser().parent} does not exist")
        raise typer.Exit(int(ExitCode.USAGE))
    try:
        res = run_demo(world=ranks, fault=fault, culprit=who, hang_timeout=hang_timeout,
                       workdir=Path(dir or from_env().dir), progress=lambda s: out.message(f"demo: {s}"))
    except DemoError as e:
        out.error(str(e))
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
    report = res.report
    if json_out:
        data = json.loads(report.to_json())
        data["demo"] = {"fault": fault, "culprit": who, "link": list(res.link) if res.link else None,
                        "found": res.found_the_fault, "seconds": round(res.seconds_total, 2),
                        "job_dir": str(res.job_dir)}
        out.json(data)
    else:
        render(report)
        out.message(f"demo: injected {fault} on rank {who}" + (f" (link {res.link[0]} -> {res.link[1]})"
                                                                  if res.link else "")
                    + f"; evidence in {res.job_dir}; {res.seconds_total:.1f} s in all")
        out.message("demo: the diagnosis " + ("names the injected fault" if res.found_the_fault
                                             else "does NOT match the injected fault"))
    if html is not None:
        write_html(out, html, report, Options(job_dir=res.job_dir, job=res.job))
    raise typer.Exit(int(ExitCode.OK if res.found_the_fault else ExitCode.FAULT))
