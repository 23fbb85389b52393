"""`report_batch(n)`: a training script tells `hetobs plan` the batch this rank computes per step.

Written to `$HETOBS_DIR/<job>/plan/rank-<r>.json` ({"schema": "hetobs.plan.batch",
"version": 1, "rank", "batch", "island"}), atomically, and only when the value changes:
call it every step if that is simplest, it costs a comparison. A failure to write is
logged, never raised into the training loop.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from hetobs.config import from_env, setting
from hetobs.jobs import job_path
from hetobs.ownership import unsafe_dir

__all__ = ["report_batch", "read_batches", "SCHEMA"]

SCHEMA = "hetobs.plan.batch"
log = logging.getLogger("hetobs.plan")
_last: dict[tuple[str, int], int] = {}
_refused: set[tuple[str, int]] = set()  # said once per job and rank


def _rank() -> int:
    raw = os.environ.get("RANK", "0")
    if not raw.isdigit():
        raise ValueError(f"RANK={raw!r}: expected a non-negative integer (or pass rank=)")
    return int(raw)


def report_batch(n: int, rank: int | None = None) -> None:
    """Record that this rank computes `n` samples per step (its data-parallel batch)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"report_batch: n = {n!r}: expected a non-negative integer")
    r = _rank() if rank is None else rank
    settings = from_env()
    key = (settings.job_id, r)
    if _last.get(key) == n:
        return
    folder = os.path.join(job_path(settings.dir, settings.job_id), "plan")
    path = os.path.join(folder, f"rank-{r}.json")
    doc = {"schema": SCHEMA, "version": 1, "rank": r, "batch": n, "island": setting("HETOBS_ISLAND").strip() or None}
    try:
        # As the native core: never into a directory another user made or can write (docs/security.md),
        # each checked before anything is made inside it.
        for d, shared in ((settings.dir, True), (os.path.dirname(folder), False), (folder, False)):
            os.makedirs(d, mode=0o700, exist_ok=True)
            why = unsafe_dir(d, shared_root=shared)
            if why:
                if key not in _refused:
                    _refused.add(key)
                    log.warning("hetobs.plan.report_batch: directory %s %s: hetobs writes nothing there", d, why)
                return
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
        _last[key] = n
    except OSError as e:
        log.warning("hetobs.plan.report_batch: cannot write %s: %s", path, e)


def read_batches(job_dir: str) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Every rank's report in the job directory (untrusted files): ({rank: doc}, problems, one line each)."""
    from hetobs.diagnosis.untrusted import RefusedPath, SafeDir

    folder = os.path.join(job_dir, "plan")
    out: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    files: list[tuple[str, str, Any]] = []  # (name, path, bytes or the OSError)
    try:  # untrusted files: no link followed (below the job directory), regular files only
        with SafeDir.open_root(job_dir) as root, root.subdir("plan") as plan:
            for name, _kind in plan.entries():
                if not (name.startswith("rank-") and name.endswith(".json") and name[5:-5].isdigit()):
                    continue
                try:
                    files.append((name, os.path.join(folder, name), plan.read(name)))
                except OSError as e:
                    files.append((name, os.path.join(folder, name), e))
    except FileNotFoundError:
        return out, problems
    except OSError as e:
        return out, [f"{folder}: unreadable ({e.strerror})"]
    for name, path, data in files:
        try:
            if isinstance(data, OSError):
                raise data
            doc = json.loads(data)
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, RefusedPath) else f"unreadable ({e})"
            problems.append(f"{path}: {why}; its rank's batch taken as even")
            continue
        batch = doc.get("batch") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("rank") != int(name[5:-5]) or \
                isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            problems.append(f"{path}: not a {SCHEMA} report for rank {name[5:-5]} (schema, rank, batch); "
                            "its rank's batch taken as even")
            continue
        island = doc.get("island")
        out[int(name[5:-5])] = {"batch": batch, "island": island if isinstance(island, str) and island else None}
    return out, problems
