"""Is a process on this host alive, stopped or gone? Read from /proc (root injectable for tests).

Only for ranks on the same host *and* network namespace as the diagnosing process:
the rank metadata's `host_key` ("<boot id>:<netns inode>") must equal ours, because a
host name alone does not say that a pid means the same process (containers,
namespaces). The process start time (field 22 of /proc/<pid>/stat) must match the
metadata's, or the pid was reused by another process and the rank is gone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["local_host_key", "process_state"]


def local_host_key(proc_root: Path) -> Optional[str]:
    try:
        boot = (proc_root / "sys/kernel/random/boot_id").read_text().strip()
        netns = os.stat(proc_root / "self/ns/net").st_ino
    except OSError:
        return None
    return f"{boot}:{netns}"


def process_state(proc_root: Path, pid: Optional[int], start_time: Optional[int]) -> Optional[str]:
    """'gone', 'reused', 'zombie', 'stopped', 'disk' (uninterruptible), 'running', or None (unknown)."""
    if pid is None or pid <= 0:
        return None
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return "gone"
    except OSError:
        return None
    tail = stat.rsplit(")", 1)[-1].split()
    if not tail:
        return None
    state = tail[0]
    if start_time is not None and len(tail) > 19 and tail[19].isdigit() and int(tail[19]) != start_time:
        return "reused"
    if state in ("Z", "X", "x"):
        return "zombie"
    if state in ("T", "t"):
        return "stopped"
    if state == "D":
        return "disk"
    return "running"
