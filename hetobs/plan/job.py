"""Read a job's collectives (live stats segments on this node, or its latest dumps) and plan it.

The data-parallel communicator is the one every rank has with the whole world as
members, preferring the hierarchical ("islands") one, then the one with the most
completed collectives. A rank's island is its records' (hetobs_islands), else the one
its `report_batch` file names, else its own ("rank<r>": each rank counted as an
island of one, which makes eta_mix's bound the sum of every rank alone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence, cast

from hetobs import stats

from .accounting import OpTime, account
from .model import PlanError, build_plan
from .report import read_batches

__all__ = ["Timelines", "read_live", "read_dumps", "choose_comm", "plan_job", "RECORDS"]

RECORDS = 512  # newest records read per rank: plenty of steps, a cheap read

# rank -> comm key -> (comm size, has island records, completed collectives)
Timelines = dict[int, dict[Any, tuple[int, bool, list[OpTime]]]]


def _add(out: Timelines, rank: int, key: Any, size: int, island: str | None, op: OpTime) -> None:
    s, isl, ops = out.setdefault(rank, {}).get(key, (size, False, []))
    ops.append(op)
    out[rank][key] = (size, isl or bool(island), ops)


def read_live(job: str, shm_dir: str = "/dev/shm", records: int = RECORDS) -> tuple[Timelines, dict[int, str], int]:
    """(timelines, islands named by records, world size) from this node's segments; world 0 if none."""
    out: Timelines = {}
    islands: dict[int, str] = {}
    world = 0
    for path in stats.segment_paths(job, shm_dir):
        try:
            seg = stats.read_segment(path, records=records)
        except stats.StatsError:
            continue  # a vanished or foreign segment: the rank counts as missing
        world = max(world, seg.world_size)
        out.setdefault(seg.rank, {})
        if seg.island:
            islands[seg.rank] = seg.island
        for rec in seg.records:
            seq = rec["collective_seq_id"]
            start, end = rec["time_discovered_started_ns"], rec["time_discovered_completed_ns"]
            if rec["state"] != "completed" or not seq or not start or not end:
                continue
            phases = rec.get("phases")
            vendor = phases.get("vendor_ns") if isinstance(phases, dict) else None
            # read_segment writes these fields as ints (and the island as a name or None)
            island = rec.get("island")
            _add(out, seg.rank, rec["comm_id"], cast(int, rec["comm_size"]),
                 island if isinstance(island, str) else None,
                 OpTime(cast(int, seq), cast(int, start), cast(int, end), cast("int | None", vendor)))
    return out, islands, world


def read_dumps(job_dir: Path, records: int = RECORDS,
               trust: bool = False) -> tuple[Timelines, dict[int, str], int, str | None, list[str]]:
    """(timelines, islands, world size, incident, problems) from the job's latest incident."""
    from hetobs.diagnosis.loader import load_job
    from hetobs.diagnosis.types import Options

    loaded = load_job(Options(job_dir=job_dir, tail_entries=records, trust_dir=trust))
    out: Timelines = {}
    islands: dict[int, str] = {}
    for rank, dump in loaded.dumps.items():
        out.setdefault(rank, {})
        for key, view in dump.comms.items():
            for rec in view.recent:
                if rec.island:
                    islands[rank] = rec.island
                if rec.state != "completed" or not rec.seq or not rec.started_ns or not rec.completed_ns:
                    continue
                vendor = rec.phases.vendor_ns if rec.phases is not None else None
                _add(out, rank, key, view.size or 0, rec.island,
                     OpTime(rec.seq, rec.started_ns, rec.completed_ns, vendor))
    return out, islands, loaded.world_size or 0, loaded.incident, [f"{p.path}: {p.problem}" for p in loaded.problems]


def choose_comm(timelines: Timelines, world: int) -> Any:
    """The data-parallel communicator's key (see the module doc); None when the ranks share none."""
    keys: set[Any] | None = None
    for comms in timelines.values():
        keys = set(comms) if keys is None else keys & set(comms)
    if not keys:
        return None

    def rank_of(key: Any) -> tuple[bool, bool, int]:
        views = [timelines[r][key] for r in timelines]
        return (all(v[0] == world for v in views), any(v[1] for v in views), min(len(v[2]) for v in views))

    return max(sorted(keys, key=str), key=rank_of)


def plan_job(job: str, job_dir: str, global_batch: int, *, source: str = "auto", shm_dir: str = "/dev/shm",
             last: int = 0, max_batch: int | Sequence[int | None] | None = None,
             trust: bool = False) -> dict[str, Any]:
    """The plan document for a job (source: auto = live segments if every rank's is here, else dumps)."""
    if source not in ("auto", "live", "dumps"):
        raise ValueError(f"source {source!r}: expected auto, live or dumps")
    notes: list[str] = []
    incident = None
    timelines: Timelines = {}
    islands: dict[int, str] = {}
    world = 0
    used = source
    if source in ("auto", "live"):
        timelines, islands, world = read_live(job, shm_dir)
        complete = world > 0 and set(timelines) == set(range(world))
        if not complete:
            if source == "live":
                raise PlanError(f"job {job}: stats segments of {len(timelines)} of {world or '?'} ranks on this node "
                                "(a job across hosts: run `hetobs dump --job` and plan from the dumps)")
            used = "dumps"
        else:
            used = "live"
    if used == "dumps":
        timelines, islands, world, incident, notes = read_dumps(Path(job_dir), trust=trust)
        if not timelines:
            raise PlanError(f"job {job}: no live stats segments on this node and no dumps under {job_dir}/incidents")
        missing = sorted(set(range(world)) - set(timelines)) if world else []
        if missing:
            raise PlanError(f"job {job}: incident {incident} lacks the dumps of ranks {_ranges(missing)}")
    world = world or len(timelines)
    key = choose_comm(timelines, world)
    if key is None:
        raise PlanError(f"job {job}: the ranks share no communicator with completed collectives")
    window = account({r: timelines[r][key][2] for r in timelines}, last)
    if window is None:
        raise PlanError(f"job {job}: fewer than two collectives every rank completed on communicator {key}")
    reports, problems = read_batches(job_dir)
    notes += problems
    ranks = sorted(window.ranks)
    even = global_batch // len(ranks) if global_batch % len(ranks) == 0 else global_batch / len(ranks)
    current = {r: reports[r]["batch"] if r in reports else even for r in ranks}
    names = {r: islands.get(r) or (reports.get(r) or {}).get("island") or f"rank{r}" for r in ranks}
    doc = build_plan(window, names, current, global_batch, max_batch)
    return {"job": job, "source": used, "incident": incident, "comm": key,
            "batch_reported": sorted(reports), **doc, "notes": notes}


def _ranges(ranks: Iterable[int]) -> str:
    from hetobs.diagnosis.loader import rank_ranges

    return rank_ranges(ranks)

