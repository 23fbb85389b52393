"""The vocabulary of a diagnosis: verdict kinds, verdicts, data problems, the report.

Data only (plus JSON conversion). Every finding has a kind from `VerdictKind` and
evidence lines that quote the numbers it used, so a person can check the tool's
reasoning instead of trusting it. `Report.to_dict()` is the `hetobs diagnose --json`
contract of DESIGN.md: `{"job", "status", "verdicts": [{"kind", "ranks", "links",
"comm", "seq", "op", "confidence", "summary", "evidence"}], ...}`; the keys after
"verdicts" ("incident", "source", "data_problems", "ranks", "exclude_hosts", "notes")
are additions readers may ignore.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional, Union

__all__ = [
    "VerdictKind", "Verdict", "DataProblem", "RankState", "Report", "Options",
    "Status", "CommKey", "RequestDump", "FreshDump", "ProgressCallback",
]

# hetobs communicators are numbered; Flight Recorder process groups are named ("0", "default_pg").
CommKey = Union[int, str]


class Status(str, Enum):
    """Overall outcome of a diagnosis (the CLI maps it to an exit code)."""

    FAULT = "fault"  # at least one fault verdict: exit 1
    HEALTHY = "healthy"  # usable data and no fault (advisory verdicts may remain): exit 0
    NO_DATA = "no_data"  # nothing usable to judge: exit 3


class VerdictKind(str, Enum):
    """What went wrong, and where. Each value is one kind of finding.

    The first eight are faults (the job hangs or failed); `straggler` and `slow_link`
    are advisory: a job that is slow but progressing is healthy, so they never turn
    the status into "fault" and never put a host on the exclude list.
    """

    RANK_DEAD = "rank_dead"
    """The process is gone (or a zombie) and was gone at the incident: it left no dump,
    its peers' side-channel requests went unanswered or its connections closed mid-op."""

    RANK_UNRESPONSIVE = "rank_unresponsive"
    """The process exists but answered nobody: stopped (SIGSTOP, state T), in
    uninterruptible sleep, or on another host where whether it lives cannot be checked.
    When every rank of one host is dead or unresponsive, one verdict of this kind (or
    `rank_dead` when all are dead) names the host and all its ranks (hosts.py)."""

    RANK_NOT_JOINED = "rank_not_joined"
    """The rank is alive but never called the collective its peers are stuck in; the
    evidence says where it is instead (another op, or its innermost Python frame)."""

    OP_MISMATCH = "op_mismatch"
    """At one sequence id the ranks called different ops (op, dtype, count or root).
    The majority decides who deviated; without a majority every side is named."""

    LINK_STALLED = "link_stalled"
    """Inside a collective every rank joined, the sender sent frames the receiver
    never received and neither side moved for the stall time: blame the link (src, dst)."""

    RANK_STALLED = "rank_stalled"
    """Inside a collective every rank joined, a rank received everything it was sent
    but did not send on to its successor: blame that rank."""

    STRAGGLER = "straggler"
    """Advisory: the rank arrives at collectives consistently later than the others."""

    SLOW_LINK = "slow_link"
    """Advisory: a link moves bytes far slower than the other links of its transport."""

    DEADLOCK = "deadlock"
    """A cycle of waits across communicators: rank A waits in comm X on rank B, which
    waits in comm Y on rank A (or a longer cycle). Each member's ranks are named."""

    TRANSPORT_ERROR = "transport_error"
    """A connection failed (reset, protocol error, could not be re-made) between two ranks
    that were both alive: blame the link, not either rank; `links` gives the direction that
    loses packets where the ends' reconnect records tell it (transport.py)."""

    DATA_MISMATCH = "data_mismatch"
    """The ranks' results of one collective differ where they must be bit-identical (result
    digests, HETOBS_DIGEST): silent data corruption. The ranks named hold a result that
    differs from the majority's; `seq`, `op`, `comm` and the evidence's first differing
    element say where (integrity.py)."""

    @property
    def is_fault(self) -> bool:
        return self not in (VerdictKind.STRAGGLER, VerdictKind.SLOW_LINK)


@dataclass
class Verdict:
    """One finding: what, who, where, how sure, and the numbers behind it."""

    kind: VerdictKind
    ranks: list[int]
    summary: str
    evidence: list[str] = field(default_factory=list)
    links: list[tuple[int, int]] = field(default_factory=list)
    comm: Optional[CommKey] = None
    seq: Optional[int] = None
    op: Optional[str] = None
    confidence: float = 0.5
    islands: dict[int, str] = field(default_factory=dict)  # island of each rank named (island jobs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "ranks": list(self.ranks),
            "links": [[int(s), int(d)] for s, d in self.links],
            "comm": self.comm,
            "seq": self.seq,
            "op": self.op,
            "confidence": round(float(self.confidence), 3),
            "summary": self.summary,
            "evidence": list(self.evidence),
            "islands": {str(r): i for r, i in sorted(self.islands.items())},
        }


@dataclass
class DataProblem:
    """A file that could not be used as it is (or should exist and does not)."""

    path: str
    problem: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "problem": self.problem}


@dataclass
class RankState:
    """One row of the per-rank table: where each rank was at the incident."""

    rank: int
    host: Optional[str]
    op: Optional[str]
    seq: Optional[int]
    state: str  # in_op, not_joined, failed, idle, done, no_dump, dead, stopped, exited, unknown
    waiting_on: list[int] = field(default_factory=list)
    comm: Optional[CommKey] = None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "comm": self.comm, "op": self.op, "seq": self.seq,
                "state": self.state, "waiting_on": list(self.waiting_on)}


@dataclass
class Report:
    """What `diagnose()` returns. Never raises for bad input: problems are listed."""

    job: Optional[str]
    status: Status
    verdicts: list[Verdict] = field(default_factory=list)
    data_problems: list[DataProblem] = field(default_factory=list)
    ranks: list[RankState] = field(default_factory=list)
    exclude_hosts: list[str] = field(default_factory=list)
    incident: Optional[str] = None
    source: str = "hetobs"  # or "flight_recorder"
    world_size: Optional[int] = None
    notes: list[str] = field(default_factory=list)
    # A suspected hang's state (suspicion.IncidentState.to_dict): suspected, resolved (slow, not
    # hung: nobody is blamed) or confirmed; None for an incident no watchdog suspected.
    suspicion: Optional[dict[str, Any]] = None

    @property
    def faults(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.kind.is_fault]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "status": self.status.value,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "incident": self.incident,
            "source": self.source,
            "world_size": self.world_size,
            "data_problems": [p.to_dict() for p in self.data_problems],
            "ranks": [r.to_dict() for r in self.ranks],
            "exclude_hosts": list(self.exclude_hosts),
            "notes": list(self.notes),
            "suspicion": self.suspicion,
        }

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)


@dataclass(frozen=True)
class FreshDump:
    """What an on-demand dump request got: the incident the answers were written under
    (None when nobody answered) and the ranks that did not answer (rank -> why)."""

    incident: Optional[str]
    unanswered: dict[int, str] = field(default_factory=dict)


# (job_dir, timeout_s) -> the fresh dump's incident id (or a FreshDump, which also says who
# did not answer), None when no dump arrived in time. Wired to hetobs.jobs.request_dump by the CLI.
RequestDump = Callable[[Path, float], Union[None, str, FreshDump]]
# (files_done, files_total): called while loading, for a progress bar.
ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class Options:
    """What to diagnose and how. Exactly one of `job_dir` / `fr_dir` is set.

    `proc_root` and `host_key` exist so tests can fake /proc and "this host";
    `now_ns` fixes the clock. `stall_s` overrides the time without progress after
    which an in-flight op counts as stuck (default: 0.9 x the dumps' hang timeout, or of the stall at
    which a suspected incident was dumped: suspicion.py).
    """

    job_dir: Optional[Path] = None
    fr_dir: Optional[Path] = None
    incident: Optional[str] = None
    job: Optional[str] = None  # job id for the report (default: the job directory's name)
    proc_root: Path = Path("/proc")
    host_key: Optional[str] = None  # "<boot id>:<netns inode>" of this host; None: read from proc_root
    now_ns: Optional[int] = None
    stall_s: Optional[float] = None
    tail_entries: int = 8  # op records kept per rank and communicator (the rest is summarized)
    request_dump: Optional[RequestDump] = None  # live jobs: ask for a fresh dump (optional)
    last_progress: Optional[Callable[[Path], Optional[int]]] = None  # job dir -> last progress ns (live telemetry)
    heartbeat: Optional[Callable[[str], Optional[int]]] = None  # stats segment path -> last heartbeat ns, if readable
    live_wait_s: float = 15.0
    progress: Optional[ProgressCallback] = None
    fr_prefix: Optional[str] = None  # Flight Recorder file prefix (default: inferred)
    # Read a job directory owned by another user (or writable by others): its files may be planted.
    trust_dir: bool = False
    # Live jobs: judge the last window_s seconds of a fresh on-demand dump (window.py advisories).
    window_s: Optional[float] = None
