"""Blank every free-text field of hetobs dumps (issue 30, text-blind diagnosis).

A 2.1 dump says everything the diagnosis needs as fields; its sentences are for people.
`blank_job(src, dst)` copies a job directory and empties every sentence in every 2.1 dump
of it, so a test can diagnose both and compare the verdicts. `verdict_keys` is what must
not change: kinds, ranks, links, comm and seq (summaries and evidence quote the text).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

__all__ = ["blank_dump", "blank_job", "verdict_keys", "FREE_TEXT"]

# Where a dump holds words rather than data (docs/dump-schema.md).
FREE_TEXT = ("cause", "comms[].cause", "entries[].error", "python.stacks", "links[].reconnect.events[].what")


def blank_dump(doc: dict[str, Any]) -> int:
    """Empty every free-text field of one parsed dump in place; returns how many were not empty."""
    n = 0

    def blank(obj: dict[str, Any], key: str) -> None:
        nonlocal n
        if isinstance(obj.get(key), str) and obj[key]:
            n += 1
            obj[key] = ""

    blank(doc, "cause")
    if isinstance(doc.get("python"), dict):
        blank(doc["python"], "stacks")
    for e in doc.get("entries") or []:
        if isinstance(e, dict):
            blank(e, "error")
    for c in doc.get("comms") or []:
        if not isinstance(c, dict):
            continue
        blank(c, "cause")
        if isinstance(c.get("in_flight"), dict):
            blank(c["in_flight"], "error")
        for lk in c.get("links") or []:
            rc = lk.get("reconnect") if isinstance(lk, dict) else None
            for ev in (rc or {}).get("events") or []:
                if isinstance(ev, dict):
                    blank(ev, "what")
    return n


def blank_job(src: Path, dst: Path) -> int:
    """Copy job directory `src` to `dst` with every 2.1 dump's text blanked; returns the number of
    fields blanked (a test checks it is not zero: there was text to lose)."""
    shutil.copytree(src, dst)
    n = 0
    for path in sorted((dst / "incidents").glob("*/rank-*.json")):
        doc = json.loads(path.read_text())
        if doc.get("version") != "2.1":
            continue
        n += blank_dump(doc)
        path.write_text(json.dumps(doc))
    return n


def verdict_keys(report: Any) -> list[tuple[Any, ...]]:
    """What the text must not change: each verdict's kind, ranks, links, comm and seq."""
    return [(v.kind.value, list(v.ranks), [tuple(x) for x in v.links], v.comm, v.seq) for v in report.verdicts]
