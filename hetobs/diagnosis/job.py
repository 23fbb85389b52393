"""`LoadedJob`: everything the stages read, as the loaders leave it.

Kept apart from the loaders so the stages depend on this one small type and not on
how (hetobs job directory, Flight Recorder files) the data was found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .summary import RankDump, RankMeta
from .types import CommKey, DataProblem

__all__ = ["LoadedJob", "OptionsError", "MAX_WORLD_SIZE"]

MAX_WORLD_SIZE = 1 << 20  # far beyond any job (16,384 ranks are diagnosed in seconds)


class OptionsError(ValueError):
    """The options cannot be satisfied (an incident that does not exist, no input named)."""


@dataclass
class LoadedJob:
    job: Optional[str]
    source: str  # "hetobs" | "flight_recorder"
    root: Optional[Path]
    metas: dict[int, RankMeta] = field(default_factory=dict)
    dumps: dict[int, RankDump] = field(default_factory=dict)
    incident: Optional[str] = None
    incidents: list[str] = field(default_factory=list)
    problems: list[DataProblem] = field(default_factory=list)
    incident_time_ns: Optional[int] = None
    notes: list[str] = field(default_factory=list)
    meta_ranks: set[int] = field(default_factory=set)  # ranks with a metadata file (parsed or not)
    # Ranks whose incident dump is there but unusable (corrupt, truncated, too new, refused):
    # rank -> what is wrong. Such a rank was alive to write it; it is no evidence either way.
    unusable: dict[int, str] = field(default_factory=dict)
    # Ranks whose dump comes from another incident of the same event: a sibling error incident
    # (loader._sibling_errors) or any incident of the same hang (loader._merge_same_hang): rank -> incident.
    borrowed: dict[int, str] = field(default_factory=dict)
    # Ranks with no dump anywhere that were seen alive during the hang (they asked for dumps):
    # rank -> the evidence. Such a rank is never blamed for being silent.
    alive_in_hang: dict[int, str] = field(default_factory=dict)
    # Ranks this diagnosis asked for an on-demand dump that did not answer: rank -> why.
    unanswered_live: dict[int, str] = field(default_factory=dict)
    # Communicator membership and ring as most ranks report them (never one rank's word).
    members: dict[CommKey, tuple[int, ...]] = field(default_factory=dict)
    rings: dict[CommKey, tuple[int, ...]] = field(default_factory=dict)

    @property
    def world_size(self) -> Optional[int]:
        # Bounded: the stages walk range(world_size), and one file saying 10**18 must not hang them.
        sizes = [m.world_size for m in self.metas.values() if m.world_size and 0 < m.world_size <= MAX_WORLD_SIZE]
        sizes += [d.world_size for d in self.dumps.values() if d.world_size and 0 < d.world_size <= MAX_WORLD_SIZE]
        if sizes:
            return max(set(sizes), key=sizes.count)
        known = list(self.metas) + list(self.dumps)
        for members in self.members.values():
            known.extend(members)
        known = [r for r in known if 0 <= r < MAX_WORLD_SIZE]
        return max(known) + 1 if known else None

    def host_of(self, rank: int) -> Optional[str]:
        d = self.dumps.get(rank)
        if d is not None and d.host:
            return d.host
        m = self.metas.get(rank)
        return m.host if m is not None else None

    def hang_timeout_s(self) -> Optional[float]:
        values = [d.hang_timeout_s for d in self.dumps.values() if d.hang_timeout_s]
        values += [m.hang_timeout_s for m in self.metas.values() if m.hang_timeout_s]
        return min(values) if values else None
