"""Process exit codes of every `hetobs` command, in one place.

2 is what typer/click use for usage errors, so hetobs keeps it; the others are
hetobs's own (documented in the README and relied on by scripts and CI).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode"]


class ExitCode(IntEnum):
    OK = 0  # success; a diagnosis found the job healthy
    FAULT = 1  # a diagnosis found a fault (the report itself is valid)
    USAGE = 2  # bad arguments or settings
    NO_DATA = 3  # no usable data: no job directory, unreadable dumps, unknown schema
    INTERNAL = 4  # internal or I/O error; the native core failed to load
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
