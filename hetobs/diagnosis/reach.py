"""Stage 1, reachability: which ranks left no dump, and were they dead, stopped or silent?

Judged as of the incident, because most diagnoses are post-mortem: by the time a
person looks, the scheduler may have killed every rank. So a process that is gone
*now* is only blamed when the incident itself shows it was gone then (peers'
side-channel requests went unanswered, or its connections closed mid-op); a rank
that answered its peers at the incident and vanished later is a culprit only when
nothing else explains the hang (the engine decides that last). Ranks whose metadata
says they exited cleanly are not faults.

Evidence that a rank was alive at the incident means it is never a culprit by itself:
a dump that is there but unusable (truncated, corrupt, too new: it was alive to write
it), a stats-segment heartbeat later than the incident, and asking for dumps during the
hang (another rank's dump of the same hang names it as `requested_by`: its own dump is
still on its way, held up by the peers it asked).
"""

from __future__ import annotations

import os
import signal
import stat
from dataclasses import dataclass, field
from typing import Optional

from .confidence import confidence
from .job import LoadedJob
from .procfs import local_host_key, process_state
from .types import Options, Verdict, VerdictKind

__all__ = ["Reach", "assess", "verdict_for"]

_SEGMENT_PREFIX = "hetobs-stats-"


@dataclass
class Reach:
    rank: int
    state: str  # dumped | dump_unusable | exited | exited_error | dead | stopped | silent | unknown
    unanswered_by: list[int] = field(default_factory=list)
    answered_by: list[int] = field(default_factory=list)
    closed_by: list[int] = field(default_factory=list)  # peers that saw its connection close mid-op
    waited_by: list[int] = field(default_factory=list)  # peers whose watchdog said they waited on it
    exited_after: bool = False  # exited cleanly, but only after the incident
    evidence: list[str] = field(default_factory=list)
    local: bool = False  # on this host: its process could be checked
    alive_after: bool = False  # its heartbeat (or exit) is later than the incident: it lived through it
    exit_dt_s: Optional[float] = None  # a non-zero exit's time relative to the incident, when known
    alive_in_hang: bool = False  # it asked for dumps during the hang (LoadedJob.alive_in_hang)
    unanswered_here: bool = False  # this diagnosis asked it for an on-demand dump: no answer

    @property
    def gone_at_incident(self) -> bool:
        return bool(self.unanswered_by or self.closed_by or self.unanswered_here)


def _few(ranks: list[int], limit: int = 8) -> str:
    s = ", ".join(str(r) for r in ranks[:limit])
    return s + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def assess(job: LoadedJob, options: Options, closed_by: dict[int, list[int]],
           waited_by: Optional[dict[int, list[int]]] = None) -> dict[int, Reach]:
    """Reachability of every rank that left no dump (and heartbeat notes for those that did)."""
    ws = job.world_size or 0
    out: dict[int, Reach] = {}
    unanswered: dict[int, list[int]] = {}
    answered: dict[int, list[int]] = {}
    for asker in job.dumps.values():
        for r in asker.unanswered:
            unanswered.setdefault(r, []).append(asker.rank)
        for r in asker.answered:
            answered.setdefault(r, []).append(asker.rank)
    host_key = options.host_key if options.host_key is not None else local_host_key(options.proc_root)
    for r in range(ws):
        d = job.dumps.get(r)
        if d is not None:
            reach = Reach(r, "dumped")
            if d.heartbeat_ns and d.time_ns and d.hang_timeout_s:
                age = (d.time_ns - d.heartbeat_ns) / 1e9
                if age > d.hang_timeout_s:
                    reach.evidence.append(f"rank {r}'s watchdog heartbeat was {age:.1f} s old when it dumped")
            out[r] = reach
            continue
        if not job.incident and job.source == "hetobs":
            continue  # no incident: nothing is missing
        if r in job.unusable:
            out[r] = Reach(r, "dump_unusable", evidence=[
                f"rank {r}'s dump in incident {job.incident} is there but unusable ({job.unusable[r]}): it was "
                f"alive at the incident to write it; no evidence against it"])
            continue
        m = job.metas.get(r)
        reach = Reach(r, "unknown", sorted(unanswered.get(r, [])), sorted(answered.get(r, [])),
                      sorted(closed_by.get(r, [])), sorted((waited_by or {}).get(r, [])))
        where = f"rank {r}" + (f" (host {m.host}, pid {m.pid})" if m is not None else "")
        reach.evidence.append(f"{where} left no dump in incident {job.incident}")
        if reach.unanswered_by:
            reach.evidence.append(f"rank(s) {_few(reach.unanswered_by)} asked it for a dump over the side "
                                  f"channel and got no answer")
        if reach.answered_by:
            reach.evidence.append(f"rank(s) {_few(reach.answered_by)} recorded that it answered the side channel")
        if reach.closed_by:
            reach.evidence.append(f"rank(s) {_few(reach.closed_by)} saw it close its connection mid-op")
        if reach.waited_by:
            reach.evidence.append(f"rank(s) {_few(reach.waited_by)} reported waiting on it")
        if r in job.unanswered_live:
            reach.unanswered_here = True
            reach.evidence.append(f"this diagnosis asked it for an on-demand dump over its side channel and got no "
                                  f"answer ({job.unanswered_live[r]})")
        if r in job.alive_in_hang:
            reach.alive_in_hang = True
            reach.evidence.append(job.alive_in_hang[r])
        if m is not None and m.stats_segment and options.heartbeat is not None:
            hb = _safe_heartbeat(options, m.stats_segment)
            if hb and job.incident_time_ns:
                age = (job.incident_time_ns - hb) / 1e9
                reach.alive_after = age < 0
                reach.evidence.append(f"its stats segment's last watchdog heartbeat was {abs(age):.1f} s "
                                      f"{'before' if age >= 0 else 'after'} the incident"
                                      + (": it was alive at the incident" if age < 0 else ""))
        if m is not None and m.exited_cleanly:
            reach.state = "exited"
            when = ""
            if m.exit_time_ns and job.incident_time_ns:
                dt = (m.exit_time_ns - job.incident_time_ns) / 1e9
                when = f" {abs(dt):.1f} s {'after' if dt >= 0 else 'before'} the incident"
                reach.exited_after = dt > 0
            reach.evidence.append(f"its metadata says it exited cleanly{when}")
        elif m is not None and (m.exit_signal is not None or m.exit_code not in (None, 0)):
            reach.state = "exited_error"
            when = ""
            if m.exit_time_ns and job.incident_time_ns:
                dt = (m.exit_time_ns - job.incident_time_ns) / 1e9
                when = f" {abs(dt):.1f} s {'after' if dt >= 0 else 'before'} the incident"
                reach.exited_after = reach.alive_after = dt > 0
                reach.exit_dt_s = dt
            how = f"exited with status {m.exit_code}" if m.exit_signal is None else \
                f"was killed by signal {m.exit_signal} ({_signal_name(m.exit_signal)})"
            reach.evidence.append(f"its metadata says it {how}{when}"
                                  + (": it was alive at the incident" if reach.exited_after else ""))
        elif m is not None and host_key and m.host_key == host_key:
            reach.local = True
            ps = process_state(options.proc_root, m.pid, m.process_start_time)
            if ps in ("gone", "reused", "zombie"):
                reach.state = "dead"
                reach.evidence.append({"gone": f"pid {m.pid} no longer exists on {m.host}",
                                       "reused": f"pid {m.pid} now belongs to another process (start time "
                                                 f"differs): the rank's process is gone",
                                       "zombie": f"pid {m.pid} is a zombie (exited, not yet reaped)"}[ps])
            elif ps == "stopped":
                reach.state = "stopped"
                reach.evidence.append(f"pid {m.pid} exists but is stopped (state T in /proc/{m.pid}/stat)")
            elif ps in ("running", "disk"):
                reach.state = "silent"
                how = "uninterruptible sleep, state D" if ps == "disk" else "running"
                reach.evidence.append(f"pid {m.pid} exists ({how}) but left no dump")
        elif m is not None:
            reach.evidence.append(f"its host {m.host} is not this host: its process cannot be checked from here")
        out[r] = reach
    return out


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "unknown signal"


def _safe_heartbeat(options: Options, path: str) -> Optional[int]:
    # The path comes from an untrusted rank file: only a regular hetobs stats segment
    # (never a link, a FIFO that would block, or any other file) is handed on.
    if not os.path.isabs(path) or not os.path.basename(path).startswith(_SEGMENT_PREFIX):
        return None
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = None  # absent: the reader finds nothing there on its own
    if mode is not None and not stat.S_ISREG(mode):
        return None
    try:
        assert options.heartbeat is not None
        return options.heartbeat(path)
    except Exception:  # telemetry that cannot be read is just missing evidence
        return None


def verdict_for(reach: Reach, nothing_else: bool) -> Optional[Verdict]:
    """The stage-1 verdict for a rank without a dump, or None when it is not a fault."""
    r = reach.rank
    ev = list(reach.evidence)
    if reach.state == "dump_unusable":
        return None  # alive at the incident; an unreadable file is a data problem, not a culprit
    if reach.state == "exited_error" and not reach.exited_after:
        if reach.exit_dt_s is not None:
            return Verdict(VerdictKind.RANK_DEAD, [r], f"rank {r} exited with an error before the incident and "
                                                       f"left no dump", ev,
                           confidence=confidence(VerdictKind.RANK_DEAD, "exited_with_error_before"))
        if nothing_else:  # when it exited is unknown: maybe after the incident, as its victims do
            return Verdict(VerdictKind.RANK_DEAD, [r], f"rank {r} exited with an error and left no dump", ev,
                           confidence=confidence(VerdictKind.RANK_DEAD, "exited_with_error"))
        return None
    if reach.state in ("exited", "exited_error"):
        if reach.exited_after and reach.unanswered_by:
            ev.append("at the incident it answered no one although it lived on: it was stopped or stalled then")
            return Verdict(VerdictKind.RANK_UNRESPONSIVE, [r], f"rank {r} was unresponsive at the incident (it "
                                                               f"answered no one and left no dump)", ev,
                           confidence=confidence(VerdictKind.RANK_UNRESPONSIVE,
                                                 "silent_while_waited_on" if reach.waited_by else "silent"))
        return None
    if reach.state == "dead":
        if not reach.gone_at_incident and reach.alive_after:
            return None  # it lived past the incident and died later (the scheduler's kill): not a culprit
        if reach.gone_at_incident or not reach.answered_by:
            conf = confidence(VerdictKind.RANK_DEAD,
                              "gone_at_incident" if reach.gone_at_incident else "gone_not_answered")
            return Verdict(VerdictKind.RANK_DEAD, [r], f"rank {r} is dead: its process is gone and it left no dump",
                           ev, confidence=conf)
        if nothing_else:
            ev.append("it answered at the incident, so it probably died after it (e.g. killed by the scheduler); "
                      "blamed only because nothing else explains the hang")
            return Verdict(VerdictKind.RANK_DEAD, [r], f"rank {r} is gone and left no dump (it may have died "
                                                       f"after the incident)", ev,
                           confidence=confidence(VerdictKind.RANK_DEAD, "gone_after_answering"))
        return None
    if reach.alive_in_hang and reach.state in ("unknown", "silent"):
        return None  # seen alive in the hang, its dump still on its way: silence is no evidence against it
    if reach.state == "stopped":
        conf = confidence(VerdictKind.RANK_UNRESPONSIVE,
                          "stopped" if not reach.answered_by else "stopped_after_answering")
        return Verdict(VerdictKind.RANK_UNRESPONSIVE, [r], f"rank {r} is stopped (SIGSTOP?): it answered no one "
                                                           f"and left no dump", ev, confidence=conf)
    if reach.state == "silent":
        return Verdict(VerdictKind.RANK_UNRESPONSIVE, [r], f"rank {r}'s process exists but did not dump or "
                                                           f"answer its peers", ev,
                           confidence=confidence(VerdictKind.RANK_UNRESPONSIVE, "silent"))
    # unknown: another host, or no metadata
    if reach.closed_by:
        return Verdict(VerdictKind.RANK_DEAD, [r], f"rank {r} closed its connections mid-op and left no dump",
                       ev, confidence=confidence(VerdictKind.RANK_DEAD, "closed_connections"))
    if reach.unanswered_by or reach.unanswered_here:
        return Verdict(VerdictKind.RANK_UNRESPONSIVE, [r], f"rank {r} did not answer its peers and left no dump "
                                                           f"(dead or stopped: cannot check from this host)",
                       ev, confidence=confidence(VerdictKind.RANK_UNRESPONSIVE, "silent"))
    if nothing_else and not reach.alive_after:
        return Verdict(VerdictKind.RANK_UNRESPONSIVE, [r], f"rank {r} left no dump; nothing else explains the "
                                                           f"incident", ev,
                           confidence=confidence(VerdictKind.RANK_UNRESPONSIVE, "nothing_else"))
    return None
