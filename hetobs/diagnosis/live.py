"""Live jobs: when to ask for a fresh on-demand dump, and asking with a bounded wait.

A running job with no incident newer than its last progress has nothing to judge on
disk; rather than make an operator wait for the watchdog, the caller may pass
`Options.request_dump` (the CLI wires `hetobs.sidechannel.request_dump`), which asks
every rank for an on-demand dump and returns the incident id it was written under.
The engine calls it at most once, from a helper thread joined with a deadline, so a
request that hangs can never hang the diagnosis.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Optional

from .job import LoadedJob
from .procfs import local_host_key, process_state
from .summary import RankMeta
from .types import FreshDump, Options

__all__ = ["looks_alive", "wants_fresh_dump", "request_fresh_dump"]


def _running(m: RankMeta, options: Options, host_key: Optional[str], states: tuple[str, ...]) -> bool:
    """Not exited cleanly, and (on this host) its process in one of `states`; elsewhere it cannot be checked.

    A rank file of this host's name from another boot (its host_key's boot id differs) is gone: its pid,
    even with an equal start time, names some other process now.
    """
    if m.exited_cleanly:
        return False
    if host_key and m.host_key == host_key:
        return process_state(options.proc_root, m.pid, m.process_start_time) in states
    if host_key and m.host_key and m.host == socket.gethostname() and \
            m.host_key.partition(":")[0] != host_key.partition(":")[0]:
        return False
    return True


def looks_alive(job: LoadedJob, options: Options) -> bool:
    """Some rank has not exited cleanly and is not known to be gone.

    Ranks on other hosts cannot be checked and count as possibly alive; on this host
    a rank whose pid is gone (or reused) is dead, not alive, and so is one this host ran in
    an earlier boot.
    """
    if job.meta_ranks - set(job.metas):
        return True  # ranks whose metadata was not needed (they dumped): alive at the incident at least
    host_key = options.host_key if options.host_key is not None else local_host_key(options.proc_root)
    return any(_running(m, options, host_key, ("running", "disk", "stopped")) for m in job.metas.values())


def wants_fresh_dump(job: LoadedJob, options: Options, last_progress_ns: Optional[int] = None) -> bool:
    """No incident newer than the job's last progress, or one that still lacks ranks that may answer; and
    the job looks alive.

    `last_progress_ns` is the job's last progress as live telemetry (stats segments)
    tells it; without it, an existing incident counts as current. An incident still
    forming (its ranks' watchdogs fire at different moments, and a rank's own dump waits
    on the peers it asked) lacks ranks that run: a fresh dump asks them now.
    """
    if job.source != "hetobs" or not job.metas or not looks_alive(job, options):
        return False
    if not job.incidents or job.incident is None:
        return True
    if last_progress_ns is not None and job.incident_time_ns is not None and last_progress_ns > job.incident_time_ns:
        return True
    host_key = options.host_key if options.host_key is not None else local_host_key(options.proc_root)
    # A stopped process cannot answer; a dead or exited one is judged from what is on disk.
    return any(r not in job.dumps and r not in job.unusable and _running(m, options, host_key, ("running", "disk"))
               for r, m in job.metas.items())


def request_fresh_dump(options: Options, job_dir: Path) -> tuple[Optional[str], Optional[str], dict[int, str]]:
    """Call `options.request_dump` bounded by `options.live_wait_s`: (incident id, error text, the ranks that
    did not answer -> why)."""
    fn = options.request_dump
    if fn is None:
        return None, "no dump request function", {}
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
        return None, f"no on-demand dump within {options.live_wait_s:.0f} s", {}
    if "error" in result:
        return None, str(result["error"]), {}
    got = result.get("incident")
    fresh = got if isinstance(got, FreshDump) else FreshDump(got if isinstance(got, str) else None)
    inc = fresh.incident if isinstance(fresh.incident, str) and fresh.incident else None
    return inc, (None if inc else "the request returned no incident"), dict(fresh.unanswered)
