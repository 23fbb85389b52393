"""Live jobs: when to ask for a fresh on-demand dump, and asking with a bounded wait.

A running job with no incident newer than its last progress has nothing to judge on
disk; rather than make an operator wait for the watchdog, the caller may pass
`Options.request_dump` (the CLI wires `hetobs.sidechannel.request_dump`), which asks
every rank for an on-demand dump and returns the incident id it was written under.
The engine calls it at most once, from a helper thread joined with a deadline, so a
request that hangs can never hang the diagnosis.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional

from .job import LoadedJob
from .procfs import local_host_key, process_state
from .types import Options

__all__ = ["looks_alive", "wants_fresh_dump", "request_fresh_dump"]


def looks_alive(job: LoadedJob, options: Options) -> bool:
    """Some rank has not exited cleanly and is not known to be gone.

    Ranks on other hosts cannot be checked and count as possibly alive; on this host
    a rank whose pid is gone (or reused) is dead, not alive.
    """
    if job.meta_ranks - set(job.metas):
        return True  # ranks whose metadata was not needed (they dumped): alive at the incident at least
    host_key = options.host_key if options.host_key is not None else local_host_key(options.proc_root)
    for m in job.metas.values():
        if m.exited_cleanly:
            continue
        if host_key and m.host_key == host_key:
            if process_state(options.proc_root, m.pid, m.process_start_time) in ("running", "disk", "stopped"):
                return True
            continue
        return True
    return False


def wants_fresh_dump(job: LoadedJob, options: Options, last_progress_ns: Optional[int] = None) -> bool:
    """No incident newer than the job's last progress, and the job looks alive.

    `last_progress_ns` is the job's last progress as live telemetry (stats segments)
    tells it; without it, an existing incident counts as current.
    """
    if job.source != "hetobs" or not job.metas or not looks_alive(job, options):
        return False
    if not job.incidents or job.incident is None:
        return True
    if last_progress_ns is not None and job.incident_time_ns is not None:
        return last_progress_ns > job.incident_time_ns
    return False


def request_fresh_dump(options: Options, job_dir: Path) -> tuple[Optional[str], Optional[str]]:
    """Call `options.request_dump` bounded by `options.live_wait_s`: (incident id, error text)."""
    fn = options.request_dump
    if fn is None:
        return None, "no dump request function"
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["incident"] = fn(job_dir, options.live_wait_s)
        except Exception as e:  # a failed request is reported, never raised into the diagnosis
            result["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=run, name="hetobs-diagnose-request-dump", daemon=True)
    t.start()
    t.join(options.live_wait_s + 1.0)
    if t.is_alive():
        return None, f"no on-demand dump within {options.live_wait_s:.0f} s"
    if "error" in result:
        return None, str(result["error"])
    inc = result.get("incident")
    return (inc if isinstance(inc, str) and inc else None), (None if inc else "the request returned no incident")
