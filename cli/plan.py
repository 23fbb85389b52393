"""`hetobs plan --job ID --global-batch B`: the data-parallel batch per rank that equalises step time.

From the job's records (this node's live stats segments when every rank's is here,
else the latest incident's dumps: `hetobs dump --job ID` makes one): each rank's
compute time per sample between collectives, over its current batch (what
`hetobs.plan.report_batch(n)` recorded; else B / world), gives integers summing to B
and the predicted step time and eta_mix of the even and the planned split
(docs/islands.md, "Balance"). `--json`: {"plan": [{"rank", "island", "batch", ...}],
"eta_mix_even", "eta_mix_planned", ...}.

Exit codes: 0 a plan, 2 usage error, 3 no usable data (no job, too few collectives,
a rank that never computes).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from hetobs.config import from_env

from ._exit_codes import ExitCode
from ._jobdir import TrustDir, checked_job_dir
from ._output import Output

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")


@app.callback(invoke_without_command=True)
def plan(
    job: Annotated[str, typer.Option("--job", help="Job id (HETOBS_JOB_ID of the job).")],
    global_batch: Annotated[int, typer.Option("--global-batch", min=1, help="Samples per step, all ranks together.")],
    json_out: Annotated[bool, typer.Option("--json", help="The plan as one JSON document on stdout.")] = False,
    source: Annotated[str, typer.Option("--from", help="auto, live (stats segments) or dumps.")] = "auto",
    last: Annotated[int, typer.Option("--last", min=0, help="Use only the newest N steps (0: all recorded).")] = 0,
    max_batch: Annotated[Optional[int], typer.Option("--max-batch", min=1,
                                                     help="Largest batch a rank can hold (memory).")] = None,
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    shm_dir: Annotated[str, typer.Option("--shm-dir", hidden=True)] = "/dev/shm",
    trust_dir: TrustDir = False,
) -> None:
    """Balance a mixed job: batch per rank from measured compute per sample, with eta_mix even vs planned."""
    from hetobs.plan import PlanError, plan_job

    out = Output(json_mode=json_out)
    if source not in ("auto", "live", "dumps"):
        out.error(f"--from {source!r}: expected auto, live or dumps")
        raise typer.Exit(int(ExitCode.USAGE))
    job_dir = checked_job_dir(dir or from_env().dir, job, trust_dir)
    try:
        doc = plan_job(job, job_dir, global_batch, source=source, shm_dir=shm_dir, last=last,
                       max_batch=max_batch, trust=trust_dir)
    except PlanError as e:
        out.error(str(e))
        raise typer.Exit(int(ExitCode.NO_DATA)) from None
    if json_out:
        out.json(doc)
        return
    for note in doc["notes"]:
        out.warning(note)
    out.table([{"rank": p["rank"], "island": p["island"], "batch now": p["current_batch"], "planned": p["batch"],
                "ms/sample": round(p["seconds_per_sample"] * 1e3, 3), "busy %": round(p["busy_share"] * 100, 1)}
               for p in doc["plan"]], title=f"job {job}: global batch {global_batch} ({doc['source']}, "
                                            f"{doc['window']['intervals']} steps)")
    out.table([{"island": a["island"], "ranks": ",".join(map(str, a["ranks"])),
                "compute ms/step": round(a["compute_s_per_step"] * 1e3, 2),
                "wait ms/step": round(a["wait_s_per_step"] * 1e3, 2), "busy %": round(a["busy_share"] * 100, 1),
                "alone samples/s": round(a["samples_per_s"], 1)} for a in doc["islands"]], title="islands")
    out.result({"step s even": round(doc["step_s_even"], 4), "step s planned": round(doc["step_s_planned"], 4),
                "eta_mix even": round(doc["eta_mix_even"], 3), "eta_mix planned": round(doc["eta_mix_planned"], 3),
                "eta_mix now (measured step)": round(doc["eta_mix_measured"], 3)})
