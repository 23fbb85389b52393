"""`diagnose(options) -> Report`: load, then run the stages of DESIGN.md in order.

1. reachability (reach.py; a whole host cut off by the network is the path's, paths.py),
2. matching by sequence id (matcher.py; a disagreement the named deviants explain on
another communicator is their consequence) with cascades attributed to their root
(causes.py) and waits across communicators followed to the end of their chain
(waits.py: only the end is blamed), 3. the progress walk inside a
collective everyone joined (progress.py), 4. cycles of waits (deadlock.py) and,
advisory, slow ranks and links (perf.py). Verdicts that explain the same ranks are merged so each
culprit is named once, by the most specific finding; victims are never blamed. A link that broke
between two live ranks is a `transport_error` for the link (transport.py), and a host whose
every rank is dead or silent is one verdict naming the host (hosts.py).

A library: never prints, never exits. Bad input becomes data problems in the report;
only impossible options raise (`OptionsError`, a ValueError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import live
from .causes import Cause, CauseKind, cause_from_abort, cause_from_fields, op_and_seq, parse_cause, waited_on
from .confidence import confidence
from .deadlock import find_deadlocks
from .direction import orient_links
from .frloader import load_fr
from .hosts import merge_host_verdicts
from .job import LoadedJob, OptionsError
from .loader import load_job, paused_gc
from .matcher import Stuck, find_stuck, fold_consequences, mismatch_verdicts, not_joined_verdict, p2p_verdicts
from .islands import annotate as annotate_islands
from .islands import relay_link_verdicts
from .paths import path_verdicts
from .integrity import data_mismatch_verdicts
from .perf import slow_link_verdicts, straggler_verdicts
from .progress import walk
from .ranktable import rank_table
from .reach import Reach, assess, verdict_for
from .summary import RankDump
from .suspicion import read_state
from .transport import transport_verdicts
from .types import CommKey, DataProblem, Options, RankState, Report, Status, Verdict, VerdictKind
from .waits import WaitGraph, build_wait_graph
from .window import WINDOW_RECORDS, window_verdicts

__all__ = ["diagnose", "DEFAULT_HANG_TIMEOUT_S"]

DEFAULT_HANG_TIMEOUT_S = 300.0
MIN_EXCLUDE_CONFIDENCE = 0.5


def _load(options: Options) -> LoadedJob:
    if (options.job_dir is None) == (options.fr_dir is None):
        raise OptionsError("name exactly one input: a job directory or a Flight Recorder directory")
    return load_fr(options) if options.fr_dir is not None else load_job(options)


def diagnose(options: Options) -> Report:
    if options.window_s is not None:
        if not options.window_s > 0 or options.window_s == float("inf"):
            raise OptionsError(f"the window must be a positive number of seconds, not {options.window_s}")
        if options.fr_dir is not None:
            raise OptionsError("a window judges a live hetobs job: it needs a job directory, not Flight Recorder dumps")
        options = _with_window_records(options)
    job = _load(options)
    notes = list(job.notes)
    fresh_incident: Optional[str] = None
    if job.source == "hetobs" and options.request_dump is not None:
        last = options.last_progress(Path(options.job_dir)) if options.last_progress and options.job_dir else None
        # A window is always judged on a fresh dump: an older incident says nothing about the last seconds.
        fresh = options.window_s is not None and bool(job.metas or job.meta_ranks) and live.looks_alive(job, options)
        if fresh or live.wants_fresh_dump(job, options, last):
            inc, err, unanswered = live.request_fresh_dump(options, Path(options.job_dir))  # type: ignore[arg-type]
            if inc is not None:
                notes.append(f"the job is live: diagnosed a fresh on-demand dump ({inc})")
                job = load_job(_with_incident(options, inc))
                job.unanswered_live = {r: why for r, why in unanswered.items() if r not in job.dumps}
                fresh_incident = inc
            else:
                notes.append(f"the job looks live but no on-demand dump arrived: {err}")
    if options.window_s is not None and job.incident is not None and fresh_incident is None:
        notes.append(f"the window ends at incident {job.incident}, not now: no fresh dump of a live job was taken")
    report = Report(job=job.job, status=Status.NO_DATA, data_problems=list(job.problems), incident=job.incident,
                    source=job.source, world_size=job.world_size, notes=notes)
    state = read_state(job) if job.source == "hetobs" else None
    if state is not None:
        report.suspicion = state.to_dict()
    if not job.dumps:
        return _without_dumps(job, report)
    if state is not None and state.state == "resolved":
        # The op completed: its ranks were slow, not hung, and nobody is to blame for it.
        report.status = Status.HEALTHY
        return report
    # A suspected incident's dumps were taken seconds into the stall: judge them at that stall.
    threshold_s = state.threshold_s if state is not None and state.threshold_s else None
    stall_s = options.stall_s if options.stall_s is not None else 0.9 * (
        threshold_s or job.hang_timeout_s() or DEFAULT_HANG_TIMEOUT_S)
    # The loaded job is millions of acyclic objects: every collection the stages' allocations set off
    # would walk them all again (~30% of the CPU time at 16,384 ranks).
    with paused_gc():
        _judge(job, report, stall_s, options)
    return report


def _with_window_records(options: Options) -> Options:
    from dataclasses import replace
    return replace(options, tail_entries=max(options.tail_entries, WINDOW_RECORDS))


def _with_incident(options: Options, incident: str) -> Options:
    from dataclasses import replace
    return replace(options, incident=incident, request_dump=None)


def _without_dumps(job: LoadedJob, report: Report) -> Report:
    if job.source == "hetobs" and job.metas and not job.incidents:
        if all(m.exited_cleanly for m in job.metas.values()):
            report.status = Status.HEALTHY
            report.notes.append(f"no incident: all {len(job.metas)} ranks exited cleanly")
            report.ranks = [RankState(r, m.host, None, None, "exited") for r, m in sorted(job.metas.items())]
            return report
        report.notes.append("no incident recorded yet: the job may still be running; ask for an on-demand "
                            "dump (`hetobs dump --job`) to judge it live")
    return report


def _causes(job: LoadedJob) -> dict[int, Cause]:
    """Each failed rank's root cause: its 2.1 `cause_info` fields, else the native abort fields
    (1.1, 2.0), else its text (1.0, and comms of other libraries)."""
    out: dict[int, Cause] = {}
    for r, d in job.dumps.items():
        found: list[Optional[Cause]] = []
        as_data = False  # a failed comm told its failure as data: the dump's own sentence adds nothing
        for v in d.comms.values():
            if not v.failed:
                continue
            rec = next((x for x in reversed(v.recent) if x.state == "failed"), None)
            op, seq = (rec.op, rec.seq) if rec else (None, None)
            if v.cause_info is not None:
                found.append(cause_from_fields(v.cause_info, v.cause, op, seq))
            elif v.abort is not None:
                found.append(cause_from_abort(v.abort, v.cause, op, seq))
            elif v.cause:
                found.append(parse_cause(v.cause))
            as_data = as_data or v.cause_info is not None or v.abort is not None
        if d.reason == "error" and not as_data:
            if d.cause_info is not None and d.cause_info.kind != CauseKind.HANG:
                found.append(cause_from_fields(d.cause_info, d.cause))
            elif d.cause_info is None and d.cause:
                found.append(parse_cause(d.cause))
        for c in found:
            if c is not None and (r not in out or out[r].kind in (CauseKind.OTHER, CauseKind.TIMEOUT)):
                out[r] = c
    return out


def _waited_on(d: RankDump) -> list[int]:
    """The ranks a watchdog (or unexplained error) dump says this rank waited on: its 2.1 hang
    fields, else the in-flight ops' `waiting_on`, else (older dumps) the watchdog's sentence."""
    if d.cause_info is not None and d.cause_info.kind == CauseKind.HANG:
        return list(d.cause_info.culprits)
    views = [v.in_flight for v in d.comms.values() if v.in_flight is not None and v.in_flight.waits is not None]
    if views:
        return sorted({x for f in views for x in f.waited_ranks()})
    return waited_on(d.cause)


def _judge(job: LoadedJob, report: Report, stall_s: float, options: Options) -> None:
    causes = _causes(job)
    closed_by: dict[int, list[int]] = {}
    for r, c in causes.items():
        if c.kind is CauseKind.PEER_CLOSED and not c.messengers:  # first-hand reports only
            for x in c.culprits:
                closed_by.setdefault(x, []).append(r)
    waited_by: dict[int, list[int]] = {}
    for r, d in job.dumps.items():
        if d.reason == "watchdog" or (d.reason == "error" and r not in causes):
            for x in _waited_on(d):
                if x != r:
                    waited_by.setdefault(x, []).append(r)
    reach = assess(job, options, closed_by, waited_by)
    stuck = find_stuck(job, stall_s)
    graph = build_wait_graph(job, stuck)

    verdicts: list[Verdict] = []
    blamed: set[int] = set()

    def add(v: Optional[Verdict]) -> None:
        if v is not None:
            verdicts.append(v)
            blamed.update(v.ranks)

    # Stage 1: a whole host silent while TCP toward it loses packets is the path's fault; its
    # ranks are cleared (counted as explained, so no later stage blames them either).
    paths, cut_off = path_verdicts(job, reach)
    for v in paths:
        add(v)
    blamed.update(cut_off)

    # Stage 1, strong cases: no dump and gone/stopped/silent at the incident.
    pending_reach: list[Reach] = []
    for r, rc in sorted(reach.items()):
        if rc.state == "dumped" or r in cut_off:
            continue
        strong = verdict_for(rc, nothing_else=False)
        if strong is not None:
            add(strong)
        elif rc.state not in ("exited",):
            pending_reach.append(rc)
        elif rc.closed_by:
            add(Verdict(VerdictKind.RANK_NOT_JOINED, [r], f"rank {r} exited while its peers still needed it",
                        rc.evidence, confidence=confidence(VerdictKind.RANK_NOT_JOINED, "exited_while_needed")))

    # Stage 2: mismatches by majority, then who never joined (deadlocks first: they explain both sides).
    settled = _settle_mismatches(mismatch_verdicts(job, stuck), causes)
    for v in fold_consequences(job, settled, MIN_EXCLUDE_CONFIDENCE):
        if v.confidence >= MIN_EXCLUDE_CONFIDENCE:
            add(v)
        else:
            verdicts.append(v)  # no majority: names every side, blames none
    for v in find_deadlocks(graph):
        add(v)
    for comm, ranks in _chain_ends(graph, blamed):
        v = not_joined_verdict(job, graph.nodes[comm], ranks)
        graph.annotate(v, comm)
        add(v)

    held = {r for st in graph.nodes.values() for r in (*st.waiting, *st.failed)}
    for v in p2p_verdicts(job, stall_s, blamed, held):
        add(v)
    for v in relay_link_verdicts(job, stall_s, blamed):
        add(v)

    # Causes that name a culprit the stages above did not (transport failures between live ranks).
    for v in transport_verdicts(job, causes, blamed):
        add(v)

    # Stage 3: inside collectives every rank joined.
    for st in stuck:
        explained = any(v.comm == st.comm for v in verdicts) or any(r in blamed for r in st.no_dump) or \
            any(r in blamed for r in st.failed)
        if st.not_joined or explained:
            continue  # a rank missing from the op, or a cascade already explained: counters would mislead
        for v in walk(job, st, stall_s):
            add(v)

    # Stage 1, weak cases: blamed only when nothing else explains the incident.
    nothing_else = not any(v.kind.is_fault and v.confidence >= MIN_EXCLUDE_CONFIDENCE for v in verdicts)
    if nothing_else:
        for rc in pending_reach:
            add(verdict_for(rc, nothing_else=True))
    if not any(v.kind.is_fault and v.confidence >= MIN_EXCLUDE_CONFIDENCE for v in verdicts):
        for v in _timeout_verdicts(job, causes, blamed):
            add(v)

    # Silent data corruption the ranks' result digests caught (integrity.py).
    for v in data_mismatch_verdicts(job):
        add(v)

    verdicts = orient_links(job, verdicts)  # a stalled pair: only the direction that loses packets
    verdicts = merge_host_verdicts(job, verdicts)  # every rank of a host silent: one verdict for the host

    # Stage 4b: advisory (over the window only, when one is asked for).
    if options.window_s is not None:
        verdicts.extend(window_verdicts(job, options.window_s))
    else:
        verdicts.extend(straggler_verdicts(job))
        verdicts.extend(slow_link_verdicts(job))

    _place(verdicts, stuck, graph)
    annotate_islands(verdicts, job)
    verdicts.sort(key=lambda v: (not v.kind.is_fault, -v.confidence))
    report.verdicts = verdicts
    hung = [st for st in stuck if st.waiting or st.failed]
    if any(v.kind.is_fault for v in verdicts):
        report.status = Status.FAULT
    elif hung:
        report.status = Status.FAULT
        st = hung[0]
        report.notes.append(f"{len(st.waiting) + len(st.failed)} rank(s) are stuck or failed in {st.op} seq {st.seq} "
                            f"on comm {st.comm}, but no culprit could be localized from the dumps")
    else:
        report.status = Status.HEALTHY
    report.exclude_hosts = _exclude_hosts(job, verdicts)
    report.ranks = rank_table(job, reach, list(graph.nodes.values()))  # victims shown where they are held
    if job.incident_time_ns is None and job.source == "hetobs":
        report.data_problems.append(DataProblem(job.incident or "", "no dump carries time_ns"))


def _settle_mismatches(found: list[Verdict], causes: dict[int, Cause]) -> list[Verdict]:
    """Combine the dumps' own majority with the vote the ranks took when they failed.

    The native core resolves a mismatch by a majority over every rank it heard (its
    message says "deviating rank X"); that vote may have seen ranks whose dumps are
    missing. When the dumps alone have no majority (or show no mismatch at all), a
    consistent vote names the deviants; when the two disagree, nobody is blamed.
    """
    votes: dict[tuple[int, ...], list[int]] = {}
    text: dict[tuple[int, ...], str] = {}
    first: dict[tuple[int, ...], Cause] = {}
    for r, c in sorted(causes.items()):
        if c.kind is CauseKind.MISMATCH and c.culprits and c.voted:
            key = tuple(sorted(c.culprits))
            votes.setdefault(key, []).append(r)
            text.setdefault(key, c.text())
            first.setdefault(key, c)
    if len(votes) != 1:
        return found
    deviants, reporters = next(iter(votes.items()))
    quote = f"rank(s) {', '.join(map(str, reporters))} failed with the ranks' own vote: {text[deviants]}"
    out: list[Verdict] = []
    for v in found:
        if v.confidence < MIN_EXCLUDE_CONFIDENCE and set(deviants) <= set(v.ranks):
            v = Verdict(VerdictKind.OP_MISMATCH, list(deviants), f"rank{'s' if len(deviants) > 1 else ''} "
                        f"{', '.join(map(str, deviants))} called a different op at seq {v.seq} on comm {v.comm} "
                        f"than the majority", v.evidence[:-1] + [quote], comm=v.comm, seq=v.seq, op=v.op,
                        confidence=confidence(VerdictKind.OP_MISMATCH, "vote_over_weak_records"))
        elif v.confidence >= MIN_EXCLUDE_CONFIDENCE and set(v.ranks) == set(deviants):
            v.evidence.append(quote)
        out.append(v)
    if not found:
        op, seq = _op_seq(first[deviants])
        out.append(Verdict(VerdictKind.OP_MISMATCH, list(deviants), f"rank{'s' if len(deviants) > 1 else ''} "
                           f"{', '.join(map(str, deviants))} called a different op than the majority"
                           + (f" ({op} seq {seq})" if op else ""), [quote], seq=seq, op=op,
                           confidence=confidence(VerdictKind.OP_MISMATCH, "vote_only")))
    return out


def _chain_ends(graph: WaitGraph, blamed: set[int]) -> list[tuple[CommKey, list[int]]]:
    """Ranks that stuck comms wait for and that are held nowhere, each on the comm that ends its longest chain.

    A rank held in another comm's op is a victim (it waits behind someone); it is never blamed.
    """
    out: dict[CommKey, list[int]] = {}
    ends = graph.ends(lambda st: st.not_joined)
    placed: set[int] = set()
    order = sorted(graph.nodes, key=lambda c: (c not in graph.strict, str(c)))
    for c in order:
        for r in graph.nodes[c].not_joined:
            if r in blamed or r in placed or graph.is_victim(r):
                continue
            placed.add(r)
            out.setdefault(ends.get(r, c), []).append(r)
    rank_of = {c: i for i, c in enumerate(order)}
    return [(c, sorted(out[c])) for c in sorted(out, key=rank_of.__getitem__)]


def _place(verdicts: list[Verdict], stuck: list[Stuck], graph: WaitGraph) -> None:
    """Give stage-1 verdicts the op their peers were stuck in (comm, seq, op), at the end of the longest chain."""
    ends = graph.ends(lambda st: st.no_dump)
    for v in verdicts:
        if v.comm is not None or v.kind not in (VerdictKind.RANK_DEAD, VerdictKind.RANK_UNRESPONSIVE):
            continue
        end = ends.get(v.ranks[0]) if v.ranks else None
        if end is not None:
            st = graph.nodes[end]
            v.comm, v.seq, v.op = st.comm, st.seq, st.op
            v.evidence.extend(graph.waiting_here(end))
            graph.annotate(v, end)
            continue
        for st in stuck:
            if any(r in st.no_dump for r in v.ranks) and (st.waiting or st.failed):
                v.comm, v.seq, v.op = st.comm, st.seq, st.op
                break


def _timeout_verdicts(job: LoadedJob, causes: dict[int, Cause], blamed: set[int]) -> list[Verdict]:
    """Last resort: ranks that timeouts (first-hand or forwarded) say were waited on."""
    votes: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    first: dict[int, Cause] = {}
    for r, c in sorted(causes.items()):
        if c.kind is not CauseKind.TIMEOUT:
            continue
        for x in c.culprits:
            if x not in blamed and x != c.reporter:
                votes.setdefault(x, []).append(r)
                texts.setdefault(x, c.text())
                first.setdefault(x, c)
    out = []
    for x, by in sorted(votes.items()):
        op, seq = _op_seq(first[x])
        out.append(Verdict(VerdictKind.RANK_NOT_JOINED, [x], f"rank {x} was waited on until the op timed out"
                           + (f" ({op} seq {seq})" if op else ""),
                           [f"rank(s) {', '.join(map(str, by))} failed with: {texts[x]}"],
                           seq=seq, op=op, confidence=confidence(VerdictKind.RANK_NOT_JOINED,
                                                                 "waited_on_until_timeout")))
    return out


def _op_seq(c: Cause) -> tuple[Optional[str], Optional[int]]:
    """The failed op: from the records where the cause came with them, else from its text (older dumps)."""
    return (c.op, c.seq) if c.op is not None or c.from_fields else op_and_seq(c.root_text)


def _exclude_hosts(job: LoadedJob, verdicts: list[Verdict]) -> list[str]:
    hosts: list[str] = []
    for v in verdicts:
        if not v.kind.is_fault or v.confidence < MIN_EXCLUDE_CONFIDENCE:
            continue
        if v.kind in (VerdictKind.OP_MISMATCH, VerdictKind.DEADLOCK):
            continue  # a program bug, not a machine's fault
        ranks = list(v.ranks) + [x for link in v.links for x in link]
        for r in ranks:
            h = job.host_of(r)
            if h and h not in hosts:
                hosts.append(h)
    return hosts
