"""Turn exceptions that escape a command into one stderr line and an exit code.

The library raises typed exceptions and never exits; this table is the one place
that decides what a user sees for each type. Lookup walks the exception's MRO, so
the most specific entry wins (SettingError before ValueError). Known errors print
one line, with no traceback unless HETOBS_TRACEBACK=1; unknown ones are bugs, so
they always print the traceback and exit INTERNAL (never Python's 1, which would read
as "fault found").
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import TextIO

from typer import Abort

try:  # typer >= 0.26 carries its own click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # type: ignore[no-redef,import-not-found]

from hetobs.config import SettingError, setting
from hetobs.errors import HetobsError
from hetobs.ownership import UntrustedJobDir

from ._exit_codes import ExitCode

__all__ = ["KNOWN", "lookup", "report", "NoArgsIsHelpError"]

Formatter = Callable[[BaseException], str]

TRACEBACK_ENV = "HETOBS_TRACEBACK"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _plain(exc: BaseException) -> str:
    return _one_line(str(exc)) or type(exc).__name__


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_plain(exc)}"


# Optional parts of hetobs by top-level module: a missing one names the extra that brings it.
_EXTRAS = {"opentelemetry": "telemetry", "torch": "torch"}


def _import(exc: BaseException) -> str:
    missing = getattr(exc, "name", None) or ""
    top = missing.split(".")[0]
    if top in _EXTRAS:
        return f"{_plain(exc)} (an optional part: pip install 'hetobs[{_EXTRAS[top]}]')"
    if missing.startswith("hetobs._"):  # the native modules: only a build makes them
        return f"{_plain(exc)} (is hetobs built? run: bash scripts/setup.sh)"
    if missing and top != "hetobs":
        return f"{_plain(exc)} (a dependency of hetobs is missing: reinstall it with pip install hetobs)"
    return _plain(exc)


KNOWN: dict[type[BaseException], tuple[Formatter, ExitCode]] = {
    SettingError: (_plain, ExitCode.USAGE),
    UntrustedJobDir: (_plain, ExitCode.NO_DATA),  # a job directory refused: its files are no usable data
    ValueError: (_plain, ExitCode.USAGE),
    OSError: (_named, ExitCode.INTERNAL),
    HetobsError: (_named, ExitCode.INTERNAL),
    ImportError: (_import, ExitCode.INTERNAL),
}


def _usage(exc: BaseException) -> str:
    """A click/typer usage error, with where to get help: one line, no box."""
    assert isinstance(exc, UsageError)
    text = _one_line(exc.format_message())
    ctx = exc.ctx
    if ctx is not None and ctx.command.get_help_option(ctx) is not None:
        text += f" (see: {ctx.command_path} {ctx.help_option_names[0]})"
    return text


def _click(exc: BaseException) -> str:
    assert isinstance(exc, ClickException)
    return _one_line(exc.format_message())


KNOWN[UsageError] = (_usage, ExitCode.USAGE)
KNOWN[ClickException] = (_click, ExitCode.USAGE)
KNOWN[Abort] = (lambda exc: "aborted", ExitCode.INTERRUPTED)


def lookup(exc: BaseException) -> tuple[Formatter, ExitCode] | None:
    """The table entry for the most specific known base class of `exc`, if any."""
    for cls in type(exc).__mro__:
        if cls in KNOWN:
            return KNOWN[cls]
    return None


def _want_traceback() -> bool:
    # A text setting read leniently (hetobs/settings_table.py says why): any value but "" and 0.
    return setting(TRACEBACK_ENV).strip() not in ("", "0")


def report(exc: BaseException, stream: TextIO | None = None) -> ExitCode:
    """Write what the user should see for `exc` to `stream` (stderr) and return the exit code.

    A known error is one line; internal ones say how to get the traceback.
    """
    stream = sys.stderr if stream is None else stream
    entry = lookup(exc)
    if entry is None or _want_traceback():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)
    if entry is None:
        stream.write(f"error: internal error: {_named(exc)}\n")
        return ExitCode.INTERNAL
    formatter, code = entry
    hint = ""
    if code == ExitCode.INTERNAL and not _want_traceback():
        hint = f" (set {TRACEBACK_ENV}=1 to see the traceback)"
    stream.write(f"error: {formatter(exc)}{hint}\n")
    return code
