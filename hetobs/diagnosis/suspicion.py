"""Suspected hangs (docs/early-hangs.md): an incident's state, as the ranks' watchdogs marked it.

A watchdog that suspects a hang early (an op without progress far longer than its communicator
has ever shown, HETOBS_SUSPECT_*) dumps the job at once and marks the incident
`incidents/<id>/suspected.json`; the first rank to see that op complete marks it
`resolved.json` (slow, not hung); the first to reach HETOBS_HANG_TIMEOUT marks it
`confirmed.json` (the same incident, upgraded). Each file is created once by its first writer.

The engine reads the state to judge a suspected incident at its own stall (its dumps were taken
seconds into the stall, not at the hang timeout), and never blames anyone for one that
resolved. A state file that cannot be read is a data problem, never evidence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .job import LoadedJob
from .types import DataProblem
from .untrusted import RefusedPath, SafeDir

__all__ = ["IncidentState", "STATES", "read_state"]

# Later states win: a suspected hang that is confirmed is a hang, even if its op completed later.
STATES = ("suspected", "resolved", "confirmed")
_MAX_BYTES = 64 * 1024  # a state file is a few hundred bytes


@dataclass(frozen=True)
class IncidentState:
    """What the state files of one incident say (their fields: docs/dump-schema.md "Incident state")."""

    state: str  # suspected | resolved | confirmed
    suspected: Optional[dict[str, Any]]
    resolved: Optional[dict[str, Any]]
    confirmed: Optional[dict[str, Any]]
    # The stall that made it suspect (the shortest any rank used): the incident's dumps are judged at it.
    threshold_s: Optional[float]

    @property
    def duration_s(self) -> Optional[float]:
        """How long the resolved op took (start to end), else how long it stalled; None if not resolved."""
        if self.resolved is None:
            return None
        for key in ("duration_s", "stalled_s"):
            v = self.resolved.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
                return float(v)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "threshold_s": self.threshold_s, "duration_s": self.duration_s,
                "suspected": self.suspected, "resolved": self.resolved, "confirmed": self.confirmed,
                "summary": self.summary()}

    def summary(self) -> str:
        where = ""
        src = self.resolved or self.suspected or {}
        if isinstance(src.get("op"), str) and isinstance(src.get("seq"), int):
            where = f" ({src['op']} seq {src['seq']} on comm {src.get('comm_id')})"
        if self.state == "resolved":
            took = f" after {self.duration_s:.1f} s" if self.duration_s is not None else ""
            return f"suspected hang{where} resolved: the op completed{took}; slow, not hung"
        if self.state == "confirmed":
            return f"suspected hang{where} confirmed: no progress for the whole HETOBS_HANG_TIMEOUT"
        at = f" at {self.threshold_s:.1f} s without progress" if self.threshold_s is not None else ""
        return f"suspected hang{where}: dumped early{at}; not confirmed (yet) by HETOBS_HANG_TIMEOUT"


def _read_one(folder: SafeDir, name: str, problems: list[DataProblem]) -> Optional[dict[str, Any]]:
    try:
        raw = folder.read(name, _MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = (e.strerror or str(e)) if isinstance(e, RefusedPath) else f"cannot read: {e.strerror or e}"
        problems.append(DataProblem(str(folder.path / name), why))
        return None
    try:
        doc = json.loads(raw)
    except ValueError as e:
        problems.append(DataProblem(str(folder.path / name), f"not JSON ({e}): incident state ignored"))
        return None
    if not isinstance(doc, dict) or doc.get("schema") != "hetobs.incident_state":
        problems.append(DataProblem(str(folder.path / name), "not a hetobs.incident_state document: ignored"))
        return None
    return doc


def _positive(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def read_state(job: LoadedJob) -> Optional[IncidentState]:
    """The chosen incident's state, or None when no watchdog suspected it (an ordinary incident)."""
    found: dict[str, Optional[dict[str, Any]]] = dict.fromkeys(STATES)
    if job.source == "hetobs" and job.root is not None and job.incident is not None:
        try:  # entered without following links, like every read of a job directory (untrusted.py)
            with SafeDir.open_root(job.root) as root, root.subdir("incidents") as incidents, \
                    incidents.subdir(job.incident) as folder:
                for s in STATES:
                    found[s] = _read_one(folder, f"{s}.json", job.problems)
        except OSError:
            pass  # no such folder, or refused: the loader has reported it already
    # A rank's own dump says it suspected the hang, even if the state file was lost.
    thresholds = [d.suspect_threshold_s for d in job.dumps.values() if d.suspect_threshold_s]
    if found["suspected"] is not None and (t := _positive(found["suspected"].get("threshold_s"))) is not None:
        thresholds.append(t)
    if found["suspected"] is None and not thresholds:
        return None
    state = "confirmed" if found["confirmed"] else "resolved" if found["resolved"] else "suspected"
    return IncidentState(state, found["suspected"], found["resolved"], found["confirmed"],
                         min(thresholds) if thresholds else None)
