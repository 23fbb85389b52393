"""The `hetobs` console script: joins one typer app per command and maps errors to exit codes.

Each command lives in its own module exposing `app: typer.Typer` whose
`@app.callback(invoke_without_command=True)` is the command itself; this module
only wires them together. `main()` is the entry point (`[project.scripts]`): an
exception that escapes a command becomes one stderr line and an exit code chosen
in `_errors.py` — never Python's default exit 1, which means "fault found".
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import typer

from . import _errors, version
from ._exit_codes import ExitCode

__all__ = ["app", "main"]

app = typer.Typer(
    name="hetobs",
    help="Observable collective communication: benchmark, watch and diagnose collectives.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # job environments hold secrets (HETOBS_SECRET)
)

app.add_typer(version.app, name="version")


def _add_optional(name: str, command: str | None = None) -> None:
    """Register `hetobs.cli.<name>` if that module exists.

    A command module that exists but fails to import (a broken native build, a bug)
    must not take the other commands down with it — `hetobs version` is how a broken
    install gets diagnosed — so it is replaced by a stub that reports the error.
    """
    module_name = f"{__package__}.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return  # not written yet
        failure: Exception = exc
    except Exception as exc:  # any import failure: keep the other commands working
        failure = exc
    else:
        app.add_typer(module.app, name=command or name)
        return

    def _unavailable() -> None:
        # name= carries the missing module, so _errors can say whether to build or to install.
        raise ImportError(f"the '{name}' command failed to load: {type(failure).__name__}: {failure}",
                          name=getattr(failure, "name", None))

    # A plain command that accepts any arguments, so the load error is what the user sees.
    app.command(command or name, help=f"(unavailable: failed to load {module_name})",
                context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(_unavailable)


_add_optional("bench")
_add_optional("clean")
_add_optional("diagnose")
_add_optional("dump")
_add_optional("demo")
_add_optional("preload_path", "preload-path")
_add_optional("exporter")
_add_optional("jobs")
_add_optional("plan")
_add_optional("top")
_add_optional("trace")


def _add_run() -> None:
    """`hetobs run -- CMD ...` is a plain command so CMD's words reach it as extra arguments."""
    from . import run

    app.command("run", context_settings=run.CONTEXT)(run.run)


_add_run()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI and exit with an `ExitCode`.

    Not in click's standalone mode: there a usage error is drawn as a rich box of five
    lines or more, while the README promises one line on stderr; `_errors.report`
    writes it (with exit 2) like every other error.
    """
    try:
        code = app(args=list(argv) if argv is not None else None, prog_name="hetobs", standalone_mode=False)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(int(ExitCode.INTERRUPTED))
    except _errors.NoArgsIsHelpError:  # `hetobs` alone: typer has printed the help, which is the answer
        sys.exit(int(ExitCode.USAGE))
    except Exception as exc:  # the one place where exceptions become exit codes
        sys.exit(int(_errors.report(exc)))
    sys.exit(code if isinstance(code, int) else int(ExitCode.OK))


if __name__ == "__main__":
    main()
