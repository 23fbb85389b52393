"""`hetobs clean`: remove the stats segments, transport segments and control sockets of dead ranks.

Only this user's, only those whose process is gone (hetobs.clean says how that is told);
a live or stopped rank's are never touched. `--dry-run` lists without removing. `--json`:
{"dry_run", "removed": [{"path", "kind", "bytes", "why"}], "count", "bytes", "kept", "errors"}.

Exit codes: 0 done (also when there was nothing to remove), 4 some entry could not be removed.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from hetobs.clean import clean

from ._exit_codes import ExitCode
from ._output import Output

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")


@app.callback(invoke_without_command=True)
def clean_cmd(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Plain JSON on stdout.")] = False,
) -> None:
    """Remove what dead ranks left on this node (/dev/shm segments, control sockets); never a live one's."""
    out = Output(json_mode=json_out)
    res = clean(dry_run=dry_run)
    if json_out:
        out.json({"dry_run": dry_run, "removed": [dataclasses.asdict(r) for r in res.removed],
                  "count": len(res.removed), "bytes": res.bytes, "kept": res.kept, "errors": res.errors})
    else:
        verb = "would remove" if dry_run else "removed"
        for r in res.removed:
            out.message(f"{verb} {r.path} ({r.kind}, {r.bytes} bytes): {r.why}")
        out.message(f"{verb} {len(res.removed)} entries, {res.bytes} bytes; {res.kept} in use kept")
        for e in res.errors:
            out.error(e)
    if res.errors:
        raise typer.Exit(int(ExitCode.INTERNAL))
