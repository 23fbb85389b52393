"""`hetobs preload-path mpi|nccl`: the interposer library's path, plain on stdout, for
people who launch jobs their own way (e.g. `LD_PRELOAD=$(hetobs preload-path mpi)`)."""

from __future__ import annotations

from typing import Annotated

import typer

from ._exit_codes import ExitCode
from ._output import Output

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")


@app.callback(invoke_without_command=True)
def preload_path(kind: Annotated[str, typer.Argument(help="mpi or nccl")]) -> None:
    """Print the path of libhetobs_<kind>.so."""
    out = Output()
    if kind not in ("mpi", "nccl"):
        out.error(f"{kind!r}: expected mpi or nccl")
        raise typer.Exit(int(ExitCode.USAGE))
    from hetobs.preload import library_path

    try:
        path = library_path(kind)
    except FileNotFoundError as e:
        out.error(str(e))
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
    typer.echo(path)
