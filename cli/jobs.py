"""`hetobs jobs`: the jobs under HETOBS_DIR, newest first, with their start time, hosts and state.

The way back to a job whose id was made at start-up (no HETOBS_JOB_ID, torchrun's
TORCHELASTIC_RUN_ID=none): rank 0 logs the id once, and this lists it afterwards. Read
from the ranks' metadata files (ranks/rank-<r>.json), so it needs no live rank. State per
job: running (a rank's process is alive or stopped on this host), exited (every rank
exited cleanly), dead (a rank is gone without a clean exit, none runs), unknown (ranks on
other hosts only). `--json`: {"dir", "jobs": [{"job", "path", "start_time_ns", "start_time",
"hosts", "ranks", "world_size", "state", "rank_states", "incidents", "problems", "refused"}]};
state refused: the job directory is another user's or writable by others, and none of its files was read.

Exit codes: 0 listed (also when there are none), 2 usage error.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Annotated, Any, Optional

import typer

from hetobs.config import from_env
from hetobs.jobs import list_jobs

from ._output import Output

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).isoformat(timespec="seconds")


@app.callback(invoke_without_command=True)
def jobs(
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Plain JSON on stdout.")] = False,
) -> None:
    """List the jobs under HETOBS_DIR: id, start time, hosts, ranks and state (newest first)."""
    out = Output(json_mode=json_out)
    root = dir or from_env().dir
    found = list_jobs(root)
    docs: list[dict[str, Any]] = []
    for j in found:
        d = dataclasses.asdict(j)
        d["start_time"] = _iso(j.start_time_ns)
        d["rank_states"] = {str(k): v for k, v in j.rank_states.items()}
        d["problems"] = {str(k): v for k, v in j.problems.items()}
        docs.append(d)
    for j in found:
        if j.refused:
            out.warning(j.refused)
    if json_out:
        out.json({"dir": root, "jobs": docs})
        return
    if not docs:
        out.message(f"no jobs under {root}")
        return
    out.table([{"job": d["job"], "started": d["start_time"], "state": d["state"], "ranks": d["ranks"],
                "world": d["world_size"], "hosts": ",".join(d["hosts"]), "incidents": d["incidents"]} for d in docs],
              title=f"jobs under {root}")
