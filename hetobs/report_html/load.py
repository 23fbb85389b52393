"""`load_for_report(options, report)`: the dumps the report judged, loaded again for the page's pictures.

Why again: `diagnose()` returns only its Report (the engine keeps what it loaded to
itself), while the page draws per-rank detail the report does not carry (islands,
op times, link counters). The incident the report names is read, never a newer one,
and no live dump is requested.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..diagnosis.frloader import load_fr
from ..diagnosis.job import LoadedJob
from ..diagnosis.loader import load_job
from ..diagnosis.types import Options, Report

__all__ = ["load_for_report"]


def load_for_report(options: Options, report: Report) -> Optional[LoadedJob]:
    """What the engine loaded for `report` (None when it cannot be read again: the page then shows the report only)."""
    opts = replace(options, request_dump=None, progress=None,
                   incident=report.incident if options.job_dir is not None and report.incident else options.incident)
    try:
        return load_fr(opts) if opts.fr_dir is not None else load_job(opts)
    except (OSError, ValueError):
        return None
