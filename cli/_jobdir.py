"""The job directory a command reads, checked first: another user's (or a writable-by-all) one is refused.

One check for every reader (hetobs.ownership.check_job_dir, the same `hetobs diagnose`
makes): a refusal is an UntrustedJobDir, which cli/_errors turns into one line naming the
path and exit code 3 (no usable data); `--trust-dir` reads it anyway.
"""

from __future__ import annotations

from typing import Annotated

import typer

from hetobs.jobs import job_path
from hetobs.ownership import check_job_dir

__all__ = ["TrustDir", "checked_job_dir"]

TrustDir = Annotated[bool, typer.Option("--trust-dir", help="Read a job directory owned by another user or writable "
                                                             "by others (refused by default: its files could be "
                                                             "planted).")]


def checked_job_dir(root: str, job: str, trust: bool) -> str:
    """HETOBS_DIR/<job>, once it passed the check (absent is fine: the command says what it lacks)."""
    path = job_path(root, job)
    check_job_dir(path, trust=trust)
    return path
