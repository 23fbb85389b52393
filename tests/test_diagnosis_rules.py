"""The diagnosis engine on synthetic dumps: one test per verdict kind and per data problem.

No processes: each test builds a job directory with tests/diagnosis_factory.py (the
style of torch's test_fr_analysis.py), bends one thing, and checks that the engine
names exactly the culprit — and no innocent rank — with evidence quoting the numbers.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Optional

import pytest

from diagnosis_factory import (
    HOST_KEY, T0, JobSpec, fake_proc, local_key, make_comm, make_dump, make_entry, make_in_flight, make_link,
    make_peer, ring_progress, stacks,
)
from hetobs.diagnosis import Options, OptionsError, Status, VerdictKind, diagnose
from hetobs.diagnosis.causes import parse_cause
from hetobs.diagnosis.fastread import IntListTable, read_document
from hetobs.diagnosis.stacks import innermost_frame


def run(job_dir: Path, **kw: object) -> "object":
    kw.setdefault("host_key", "not-this-host")
    return diagnose(Options(job_dir=job_dir, **kw))  # type: ignore[arg-type]


def kinds(report) -> list[str]:  # type: ignore[no-untyped-def]
    return [v.kind.value for v in report.verdicts]


def faults(report) -> list:  # type: ignore[no-untyped-def]
    return [v for v in report.verdicts if v.kind.is_fault]


def blamed(report) -> set[int]:  # type: ignore[no-untyped-def]
    out: set[int] = set()
    for v in faults(report):
        out.update(v.ranks)
        for s, d in v.links:
            out.update((s, d))
    return out


# --- one test per verdict kind --------------------------------------------------------

@pytest.mark.parametrize("culprit", [0, 2, 3])
def test_rank_not_joined_names_it_and_where_it_is(tmp_path: Path, culprit: int) -> None:
    job = JobSpec(4)
    job.not_joined(culprit, where="sleep", line=88)
    rep = run(job.write(tmp_path))
    assert rep.status == Status.FAULT
    assert kinds(rep) == ["rank_not_joined"]
    v = rep.verdicts[0]
    assert v.ranks == [culprit] and v.comm == 0 and v.seq == 17 and v.op == "all_reduce"
    text = "\n".join(v.evidence)
    assert "sleep at rank_programs.py:88" in text
    assert "have waited for 5.0 s" in text
    assert rep.exclude_hosts == [f"node{culprit // 2}"]
    states = {r.rank: r.state for r in rep.ranks}
    assert states[culprit] == "not_joined"
    assert all(states[r] == "in_op" for r in range(4) if r != culprit)
    assert all(r.waiting_on == [culprit] for r in rep.ranks if r.rank != culprit)


def test_not_joined_rank_several_behind_and_in_another_op(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(1)
    c = job.comm(1)
    c["last_coll_seq"] = 12
    job.dumps[1]["entries"] = [e for e in job.dumps[1]["entries"] if e["collective_seq_id"] <= 12]
    job.dumps[1]["comms"].append(make_comm(5, [1, 3], 1, last_coll_seq=2,
                                           in_flight=make_in_flight(3, op="broadcast", seconds=0.2)))
    rep = run(job.write(tmp_path))
    v = rep.verdicts[0]
    assert v.kind == VerdictKind.RANK_NOT_JOINED and v.ranks == [1]
    text = "\n".join(v.evidence)
    assert "5 behind" in text and "in broadcast seq 3 on comm 5" in text


def test_rank_dead_same_host_pid_gone(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {1000: ("S", 5000), 1001: ("S", 5001), 1003: ("S", 5003)})
    key = local_key(proc)
    job = JobSpec(4, host_key=key)
    job.drop_dump(2)  # pid 1002 is not in the fake /proc
    rep = run(job.write(tmp_path), proc_root=proc, host_key=None)
    assert kinds(rep) == ["rank_dead"]
    v = rep.verdicts[0]
    assert v.ranks == [2] and v.confidence >= 0.9
    text = "\n".join(v.evidence)
    assert "pid 1002 no longer exists" in text and "got no answer" in text
    assert {r.rank: r.state for r in rep.ranks}[2] == "dead"
    assert any("no dump from rank(s) 2" in p.problem for p in rep.data_problems)


def test_rank_dead_pid_reused_counts_as_gone(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {1002: ("S", 99999)})  # same pid, another process
    job = JobSpec(4, host_key=local_key(proc))
    job.drop_dump(2)
    rep = run(job.write(tmp_path), proc_root=proc, host_key=None)
    assert kinds(rep) == ["rank_dead"] and rep.verdicts[0].ranks == [2]
    assert "another process" in "\n".join(rep.verdicts[0].evidence)


def test_rank_unresponsive_stopped(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {1000 + r: ("T" if r == 1 else "S", 5000 + r) for r in range(4)})
    job = JobSpec(4, host_key=local_key(proc))
    job.drop_dump(1)
    rep = run(job.write(tmp_path), proc_root=proc, host_key=None)
    assert kinds(rep) == ["rank_unresponsive"]
    assert rep.verdicts[0].ranks == [1]
    assert "stopped (state T" in "\n".join(rep.verdicts[0].evidence)
    assert {r.rank: r.state for r in rep.ranks}[1] == "stopped"


def test_rank_on_other_host_unanswered_is_unresponsive(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.drop_dump(3)
    rep = run(job.write(tmp_path))
    assert kinds(rep) == ["rank_unresponsive"] and rep.verdicts[0].ranks == [3]
    assert "cannot be checked from here" in "\n".join(rep.verdicts[0].evidence)


def test_dead_after_the_incident_is_not_a_culprit(tmp_path: Path) -> None:
    """Post-mortem: every pid is gone now (the scheduler killed the job). Rank 3 answered at the
    incident but its dump was lost; rank 2 never joined. Only rank 2 is blamed."""
    proc = fake_proc(tmp_path / "proc", {})
    job = JobSpec(4, host_key=local_key(proc))
    job.not_joined(2)
    job.dumps[3] = None  # answered (see side_channel of rank 0) but no dump file
    rep = run(job.write(tmp_path), proc_root=proc, host_key=None)
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_not_joined", [2])]


def test_gone_rank_blamed_when_nothing_else_explains(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {})
    job = JobSpec(4, host_key=local_key(proc))
    job.dumps[3] = None  # answered, gone now, nothing else wrong
    rep = run(job.write(tmp_path), proc_root=proc, host_key=None)
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_dead", [3])]
    assert rep.verdicts[0].confidence < 0.5
    assert rep.exclude_hosts == []  # too unsure to exclude a host


def test_exited_cleanly_is_not_a_fault(tmp_path: Path) -> None:
    job = JobSpec(4, seconds=0.5)  # progressing: nobody waits long
    job.dumps[3] = None
    job.metas[3]["exited_cleanly"] = True
    job.metas[3]["exit_time_ns"] = T0 + 10**9
    rep = run(job.write(tmp_path))
    assert rep.status == Status.HEALTHY and faults(rep) == []
    assert {r.rank: r.state for r in rep.ranks}[3] == "exited"


def test_all_exited_cleanly_without_incident_is_healthy(tmp_path: Path) -> None:
    job = JobSpec(3)
    for m in job.metas.values():
        m["exited_cleanly"] = True
    job_dir = job.write(tmp_path)
    import shutil
    shutil.rmtree(job_dir / "incidents")
    rep = run(job_dir)
    assert rep.status == Status.HEALTHY and rep.verdicts == []


def test_op_mismatch_by_majority_names_only_the_deviant(tmp_path: Path) -> None:
    """Every rank errored and exited; rank 2 called a different count. Only rank 2 is named."""
    proc = fake_proc(tmp_path / "proc", {})  # all processes gone afterwards
    job = JobSpec(4, seq=7, incident="error-c0-s7", host_key=local_key(proc))
    msg = ("all_reduce seq 7 count 262144 float32 sum on comm 0 failed at rank {r}: op mismatch on comm 0: deviating "
           "rank 2 (rank 2 called all_reduce seq 7 count 524288 float32 sum); ranks 0, 1, 3 called all_reduce seq 7 "
           "count 262144 float32 sum (this rank: {r})")
    job.fail_all({r: msg.format(r=r) for r in range(4)})
    job.dumps[2]["entries"][-1]["count"] = 524288
    rep = run(job.write(tmp_path), proc_root=proc, host_key=None)
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("op_mismatch", [2])]
    v = rep.verdicts[0]
    assert v.seq == 7 and v.op == "all_reduce" and v.confidence >= 0.8
    text = "\n".join(v.evidence)
    assert "count 524288 instead of 262144" in text and "3 of 4 ranks" in text
    assert rep.exclude_hosts == []  # a program bug: no host to exclude


def test_op_mismatch_dtype_and_op(tmp_path: Path) -> None:
    job = JobSpec(5, seq=9)
    job.fail_all({r: "op mismatch" for r in range(5)})
    job.dumps[4]["entries"][-1].update(op="broadcast", root=0, dtype="float16")
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("op_mismatch", [4])]
    assert "op broadcast instead of all_reduce, dtype float16 instead of float32" in "\n".join(rep.verdicts[0].evidence)


def test_op_mismatch_without_majority_says_so(tmp_path: Path) -> None:
    job = JobSpec(4, seq=7)
    job.fail_all({r: "op mismatch" for r in range(4)})
    for r in (2, 3):
        job.dumps[r]["entries"][-1]["count"] = 8
    rep = run(job.write(tmp_path))
    mism = [v for v in rep.verdicts if v.kind == VerdictKind.OP_MISMATCH]
    assert len(mism) == 1
    v = mism[0]
    assert v.ranks == [0, 1, 2, 3] and v.confidence < 0.5
    assert "no op has a majority" in "\n".join(v.evidence)
    assert rep.status == Status.FAULT and rep.exclude_hosts == []


def test_cascade_is_attributed_to_the_root_rank(tmp_path: Path) -> None:
    """Rank 2 died; its neighbours errored with 'closed its connection' and the others were
    aborted by them. Only rank 2 is blamed, never the neighbours that reported it."""
    job = JobSpec(4, incident="error-c0-s17")
    job.drop_dump(2)
    closed = "all_reduce seq 17 count 262144 float32 sum on comm 0 failed at rank {r}: rank 2 (host node1, pid 1002) " \
             "closed its connection (while this rank was receiving from it)"
    aborted = "all_reduce seq 17 count 262144 float32 sum on comm 0 failed at rank 0: aborted by rank 1 (host node0, " \
              "pid 1001): rank 2 (host node1, pid 1002) closed its connection (while this rank was sending)"
    job.fail_all({1: closed.format(r=1), 3: closed.format(r=3), 0: aborted})
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_dead", [2])]
    text = "\n".join(rep.verdicts[0].evidence)
    assert "rank(s) 1, 3 saw it close its connection" in text
    assert blamed(rep) == {2}


def test_link_stalled_names_src_dst(tmp_path: Path) -> None:
    ring = [0, 1, 2, 3]
    job = JobSpec(4, progress=ring_progress(ring, stalled_link=(1, 2)))
    rep = run(job.write(tmp_path))
    assert kinds(rep) == ["link_stalled"]
    v = rep.verdicts[0]
    assert v.links == [(1, 2)] and v.ranks == []
    assert "rank 1 sent 5 frame(s) to rank 2" in v.evidence[0] and "rank 2 received 1 from rank 1" in v.evidence[0]
    assert set(rep.exclude_hosts) == {"node0", "node1"}
    assert rep.to_dict()["verdicts"][0]["links"] == [[1, 2]]


def test_link_gap_that_is_still_moving_is_not_stalled(tmp_path: Path) -> None:
    """Frames in flight are normal: a sent>received gap only counts when nothing moves."""
    job = JobSpec(4, seconds=5.0, progress=ring_progress([0, 1, 2, 3], stalled_link=(1, 2)))
    for r in range(4):
        for p in job.comm(r)["in_flight"]["peers"]:
            p["seconds_since_change"] = 0.01
    rep = run(job.write(tmp_path))
    assert "link_stalled" not in kinds(rep)


def test_rank_stalled(tmp_path: Path) -> None:
    job = JobSpec(5, progress=ring_progress(list(range(5)), stalled_rank=3))
    rep = run(job.write(tmp_path))
    assert kinds(rep) == ["rank_stalled"]
    v = rep.verdicts[0]
    assert v.ranks == [3]
    assert "received 5 frame(s) from rank 2" in v.evidence[0] and "sent only 1 on to rank 4" in v.evidence[0]


def test_deadlock_across_two_communicators(tmp_path: Path) -> None:
    """Ranks 0,1 wait in comm 1 seq 5; ranks 2,3 wait in comm 2 seq 3; each needs the other pair."""
    job = JobSpec(4)
    for r in range(4):
        d = job.dumps[r]
        c0 = make_comm(0, [0, 1, 2, 3], r, last_coll_seq=16)
        first = r < 2
        c1 = make_comm(1, [0, 1, 2, 3], r, last_coll_seq=4 if first else 4,
                       in_flight=make_in_flight(5, seconds=6.0) if first else None)
        c2 = make_comm(2, [0, 1, 2, 3], r, last_coll_seq=2,
                       in_flight=None if first else make_in_flight(3, op="all_gather", seconds=6.0))
        if not first:
            c1["last_coll_seq"] = 4
        d["comms"] = [c0, c1, c2]
        d["entries"] = [make_entry(s, comm=0, rank=r) for s in range(10, 17)]
    rep = run(job.write(tmp_path))
    assert kinds(rep) == ["deadlock"]
    v = rep.verdicts[0]
    assert v.ranks == [0, 1, 2, 3]
    assert "comm 1 -> comm 2 -> comm 1" in v.summary
    text = "\n".join(v.evidence)
    assert "comm 1 (all_reduce seq 5) waits for rank(s) 2, 3" in text
    assert "comm 2 (all_gather seq 3) waits for rank(s) 0, 1" in text


def test_transport_error_between_live_ranks(tmp_path: Path) -> None:
    job = JobSpec(4, incident="error-c0-s17")
    job.fail_all({
        1: "all_reduce seq 17 on comm 0 failed at rank 1: protocol error on the control link to rank 2 "
           "(host node1, pid 1002)",
        2: "all_reduce seq 17 on comm 0 failed at rank 2: aborted by rank 1 (host node0, pid 1001): protocol error "
           "on the control link to rank 2 (host node1, pid 1002)",
        0: "all_reduce seq 17 on comm 0 failed at rank 0: aborted by rank 1 (host node0, pid 1001): protocol error "
           "on the control link to rank 2 (host node1, pid 1002)",
        3: "all_reduce seq 17 on comm 0 failed at rank 3: aborted by rank 2 (host node1, pid 1002): protocol error "
           "on the control link to rank 2 (host node1, pid 1002)",
    })
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.links) for v in faults(rep)] == [("transport_error", [(1, 2)])]


def _completed_history(job: JobSpec, *, late: dict[int, float], dur_s: float = 0.001, n: int = 16,
                       skew_only: bool = False) -> None:
    """Replace every rank's records by n completed all_reduces; rank r arrives late[r] s late."""
    slowest = max(late.values(), default=0.0)
    for r in range(job.world):
        d = job.dumps[r]
        lat = late.get(r, 0.0)
        entries = []
        for s in range(1, n + 1):
            base = T0 - (n - s) * 200_000_000
            start = base + int(lat * 1e9)
            # everyone finishes together (after the slowest arrived) unless only the clock is off
            end = (base + int((slowest + dur_s) * 1e9)) if not skew_only else start + int(dur_s * 1e9)
            e = make_entry(s, rank=r, size=job.world, started_ns=start, duration_ns=end - start)
            entries.append(e)
        d["entries"] = entries
        d["reason"] = "on_demand"
        d["comms"] = [make_comm(0, list(range(job.world)), r, last_coll_seq=n)]


def test_straggler_is_advisory(tmp_path: Path) -> None:
    job = JobSpec(4)
    _completed_history(job, late={3: 0.030})
    rep = run(job.write(tmp_path))
    assert rep.status == Status.HEALTHY  # slow but progressing: no fault
    assert kinds(rep) == ["straggler"]
    v = rep.verdicts[0]
    assert v.ranks == [3] and "30.0 ms" in v.evidence[0]
    assert rep.exclude_hosts == []


def test_clock_skew_is_not_a_straggler(tmp_path: Path) -> None:
    job = JobSpec(4)
    _completed_history(job, late={3: 0.030}, skew_only=True)
    rep = run(job.write(tmp_path))
    assert rep.verdicts == [] and rep.status == Status.HEALTHY


def test_slow_link_is_advisory(tmp_path: Path) -> None:
    job = JobSpec(6, seconds=0.1)
    for r in range(6):
        nxt = (r + 1) % 6
        busy = 10_000_000 if r != 4 else 200_000_000  # 100 MiB in 10 ms, except 4->5: 20x slower
        job.comm(r)["links"] = [make_link(nxt, bytes_sent=100 << 20, busy_ns=busy)]
    rep = run(job.write(tmp_path))
    assert rep.status == Status.HEALTHY
    assert [(v.kind.value, v.links) for v in rep.verdicts] == [("slow_link", [(4, 5)])]


# --- no false alarms ------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_no_false_alarm_on_healthy_runs(tmp_path: Path, seed: int) -> None:
    """Healthy on-demand dumps: ranks at slightly different steps, all moving, jittery arrivals."""
    import random
    rnd = random.Random(seed)
    world = rnd.randint(3, 8)
    job = JobSpec(world, seconds=rnd.uniform(0.0, 0.5), progress=ring_progress(list(range(world)),
                                                                               stalled_link=(0, 1)))
    for r in range(world):
        d = job.dumps[r]
        d["reason"] = "on_demand"
        for p in job.comm(r)["in_flight"]["peers"]:
            p["seconds_since_change"] = rnd.uniform(0.0, 0.2)
        if rnd.random() < 0.3:  # some ranks finished the op and compute
            job.comm(r)["in_flight"] = None
            job.comm(r)["last_coll_seq"] = job.seq
        for e in d["entries"]:
            if e["time_discovered_started_ns"] and e["state"] == "completed":
                e["time_discovered_started_ns"] += rnd.randint(0, 400_000)
        job.comm(r)["links"] = [make_link((r + 1) % world, bytes_sent=64 << 20,
                                          busy_ns=int(rnd.uniform(40e6, 70e6)))]
    rep = run(job.write(tmp_path))
    assert rep.status == Status.HEALTHY, rep.to_json(indent=1)
    assert faults(rep) == []


def test_no_false_alarm_on_slow_but_progressing_run(tmp_path: Path) -> None:
    """One rank 3x slower: the others wait for it every step, but everything moves."""
    job = JobSpec(4, seconds=0.2)
    _completed_history(job, late={1: 0.200}, dur_s=0.05)
    for r in range(4):  # rank 1 is computing; the others wait in seq 17 for 0.2 s (< stall time)
        if r != 1:
            job.comm(r)["in_flight"] = make_in_flight(17, seconds=0.2, peers=[make_peer((r + 1) % 4, since_s=0.2)])
    rep = run(job.write(tmp_path))
    assert rep.status == Status.HEALTHY
    assert faults(rep) == []
    assert [v.ranks for v in rep.verdicts if v.kind == VerdictKind.STRAGGLER] == [[1]]


def test_hang_without_culprit_is_still_a_fault(tmp_path: Path) -> None:
    job = JobSpec(4)  # everyone in seq 17 for 5 s, counters all equal: nothing to localize
    rep = run(job.write(tmp_path))
    assert rep.status == Status.FAULT and faults(rep) == []
    assert any("no culprit could be localized" in n for n in rep.notes)


# --- data problems --------------------------------------------------------------------

def test_missing_metadata_file(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    job.metas[3] = None
    rep = run(job.write(tmp_path))
    assert any(p.problem.startswith("missing metadata of rank(s) 3") for p in rep.data_problems)
    assert [v.ranks for v in faults(rep)] == [[2]]


def test_no_metadata_at_all(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(1)
    job.metas = {r: None for r in range(4)}
    rep = run(job.write(tmp_path))
    assert any("no rank metadata" in p.problem for p in rep.data_problems)
    assert [v.ranks for v in faults(rep)] == [[1]]


def test_truncated_dump(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    job_dir = job.write(tmp_path)
    path = job_dir / "incidents" / job.incident / "rank-1.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    rep = run(job_dir)
    probs = {Path(p.path).name: p.problem for p in rep.data_problems}
    assert probs["rank-1.json"].startswith("truncated JSON")
    assert [v.ranks for v in faults(rep)] == [[2]]  # the other dumps still name the culprit


def test_not_json_and_empty_file(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    job_dir = job.write(tmp_path)
    inc = job_dir / "incidents" / job.incident
    (inc / "rank-1.json").write_bytes(b"\x00\xffgarbage")
    (inc / "rank-3.json").write_text("")
    (inc / ".rank-0.json.tmp").write_text("{")
    rep = run(job_dir)
    probs = {Path(p.path).name: p.problem for p in rep.data_problems}
    assert "not UTF-8" in probs["rank-1.json"] or "not valid JSON" in probs["rank-1.json"]
    assert probs["rank-3.json"].startswith("empty file")
    assert "leftover temporary file" in probs[".rank-0.json.tmp"]


def test_wrong_schema(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    job.dumps[1]["schema"] = "torch.fr"
    rep = run(job.write(tmp_path))
    p = [p for p in rep.data_problems if p.path.endswith("rank-1.json")]
    assert p and "schema is 'torch.fr', expected 'hetobs.dump'" in p[0].problem


def test_newer_major_version(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    job.dumps[3]["version"] = "3.0"
    job.dumps[0]["version"] = "1.7"  # any 1.x is read
    rep = run(job.write(tmp_path))
    p = [p for p in rep.data_problems if p.path.endswith("rank-3.json")]
    assert p and "version 3.0 is newer than this reader" in p[0].problem
    assert not [p for p in rep.data_problems if p.path.endswith("rank-0.json")]


def test_no_job_directory(tmp_path: Path) -> None:
    rep = run(tmp_path / "nope")
    assert rep.status == Status.NO_DATA
    assert rep.data_problems[0].problem == "job directory does not exist"


def test_unknown_incident_is_an_options_error(tmp_path: Path) -> None:
    job_dir = JobSpec(3).write(tmp_path)
    with pytest.raises(OptionsError, match="incident 'nope' not found"):
        run(job_dir, incident="nope")


def test_latest_incident_by_time_ns_and_named_incident(tmp_path: Path) -> None:
    old = JobSpec(4, incident="hang-c0-s5")
    old.not_joined(1)
    for d in old.dumps.values():
        d["time_ns"] = T0 + 10**12  # later, although its name sorts first
    new = JobSpec(4, incident="hang-c0-s17")
    new.not_joined(3)
    old.write(tmp_path)
    job_dir = new.write(tmp_path)
    assert run(job_dir).incident == "hang-c0-s5"
    assert run(job_dir).verdicts[0].ranks == [1]
    rep = run(job_dir, incident="hang-c0-s17")
    assert rep.incident == "hang-c0-s17" and rep.verdicts[0].ranks == [3]


def test_gc_is_restored_after_loading(tmp_path: Path) -> None:
    job_dir = JobSpec(3).write(tmp_path)
    assert gc.isenabled()
    run(job_dir)
    assert gc.isenabled()


# --- live jobs --------------------------------------------------------------------------

def test_live_job_asks_for_a_fresh_dump(tmp_path: Path) -> None:
    job = JobSpec(4, incident="ondemand-1764500000000-ab12", seconds=0.1)
    for d in job.dumps.values():
        d["reason"] = "on_demand"
    job_dir = job.write(tmp_path)
    import shutil
    fresh = tmp_path / "fresh"
    shutil.move(str(job_dir / "incidents"), str(fresh))
    calls: list[tuple[Path, float]] = []

    def request(jd: Path, timeout: float) -> str:
        calls.append((jd, timeout))
        shutil.move(str(fresh), str(jd / "incidents"))  # the ranks wrote their dumps
        return job.incident

    rep = diagnose(Options(job_dir=job_dir, host_key="x", request_dump=request, live_wait_s=2.0))
    assert calls == [(job_dir, 2.0)]
    assert rep.incident == job.incident and rep.status == Status.HEALTHY
    assert any("fresh on-demand dump" in n for n in rep.notes)


def test_live_request_that_hangs_is_bounded(tmp_path: Path) -> None:
    import threading
    job_dir = JobSpec(3).write(tmp_path)
    import shutil
    shutil.rmtree(job_dir / "incidents")
    release = threading.Event()

    def request(jd: Path, timeout: float) -> str:
        release.wait(30)
        return "never"

    try:
        rep = diagnose(Options(job_dir=job_dir, host_key="x", request_dump=request, live_wait_s=0.2))
    finally:
        release.set()
    assert rep.status == Status.NO_DATA
    assert any("no on-demand dump arrived" in n for n in rep.notes)


def test_no_fresh_dump_for_a_dead_job(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {})
    job = JobSpec(3, host_key=local_key(proc))
    job_dir = job.write(tmp_path)
    import shutil
    shutil.rmtree(job_dir / "incidents")

    def request(jd: Path, timeout: float) -> str:
        raise AssertionError("must not be asked")

    rep = diagnose(Options(job_dir=job_dir, proc_root=proc, request_dump=request))
    assert rep.status == Status.NO_DATA


# --- pieces -----------------------------------------------------------------------------

def test_parse_cause_chains() -> None:
    c = parse_cause("all_reduce seq 3 count 8 float32 sum on comm 0 failed at rank 0: aborted by rank 1 (host a, "
                    "pid 2): rank 3 (host b, pid 4) closed its connection (while this rank was sending)")
    assert c is not None and c.kind == "peer_closed" and c.culprits == [3] and c.messengers == [1]
    c = parse_cause("x on comm 0 failed at rank 2: timed out after 3.00 s receiving from rank 1 (host a, pid 1) "
                    "(0 of 8 bytes; no progress in this op)")
    assert c is not None and c.kind == "timeout" and c.culprits == [1]
    c = parse_cause("op mismatch on comm 0 with no majority among the 2 ranks heard (cannot tell which deviated): "
                    "rank 0 called a; rank 1 called b (this rank: 0)")
    assert c is not None and c.kind == "mismatch_no_majority" and c.culprits == [0, 1]


def test_innermost_frame_picks_the_main_thread() -> None:
    assert innermost_frame(stacks("sleep", "/x/prog.py", 7)) == "sleep at prog.py:7"
    assert innermost_frame("garbage") is None and innermost_frame(None) is None


def test_fast_reader_equals_plain_json() -> None:
    """The tail-only reader must give what json.loads gives, even with braces in strings."""
    entries = [make_entry(s) for s in range(1, 40)]
    entries[-1]["error"] = 'weird {} {"x": 1} }, { ] [ text'
    entries[-3]["error"] = "{"
    doc = make_dump(1, 4, entries=entries, comms=[make_comm(0, list(range(64)), 1, last_coll_seq=38)],
                    python={"status": "ok", "stacks": 'File "a{b}.py", line 1 in f\n"entries": [{'})
    for raw in (json.dumps(doc).encode(), json.dumps(doc, indent=2).encode()):
        head, recs, fast = read_document(raw, IntListTable(), 5)
        assert fast
        plain = json.loads(raw)
        assert recs == plain["entries"][-5:]
        plain.pop("entries")
        plain["comms"][0]["global_ranks"] = tuple(plain["comms"][0]["global_ranks"])
        plain["comms"][0]["ring"] = tuple(plain["comms"][0]["ring"])
        assert head == plain
    doc["entries"] = entries[:3]
    head, recs, _ = read_document(json.dumps(doc).encode(), IntListTable(), 5)
    assert recs == entries[:3]
    doc["entries"] = []
    head, recs, _ = read_document(json.dumps(doc).encode(), IntListTable(), 5)
    assert recs == [] and head["rank"] == 1


def test_report_json_contract(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.not_joined(2)
    d = json.loads(run(job.write(tmp_path)).to_json())
    assert list(d)[:3] == ["job", "status", "verdicts"]
    assert set(d["verdicts"][0]) == {"kind", "ranks", "links", "comm", "seq", "op", "confidence", "summary",
                                     "evidence", "islands"}
    assert d["status"] == "fault" and d["exclude_hosts"] == ["node1"]


def test_options_need_exactly_one_input() -> None:
    with pytest.raises(OptionsError):
        diagnose(Options())
    with pytest.raises(OptionsError):
        diagnose(Options(job_dir=Path("a"), fr_dir=Path("b")))


def test_host_key_from_fake_proc(tmp_path: Path) -> None:
    from hetobs.diagnosis.procfs import local_host_key
    proc = fake_proc(tmp_path / "proc", {}, host_key=HOST_KEY)
    assert local_host_key(proc) == local_key(proc)
    _ = make_dump  # the factory's full surface is exercised elsewhere


# --- saved dumps of the 1.0 format keep loading ---------------------------------------------

SAVED = Path(__file__).parent / "data" / "dumps" / "v1.0"


@pytest.mark.parametrize(("job", "status", "verdicts"), [
    ("healthy", Status.HEALTHY, []),
    ("missing-rank", Status.FAULT, [("rank_dead", [2])]),
    ("mismatch", Status.FAULT, [("op_mismatch", [1])]),
])
def test_saved_v1_0_dumps_load(job: str, status: Status, verdicts: list) -> None:
    rep = run(SAVED / job)
    assert rep.data_problems == [] or job == "missing-rank"
    assert rep.status == status
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == verdicts
    assert rep.world_size == 4 and len(rep.ranks) == 4


def test_heartbeat_from_stats_segment_is_evidence(tmp_path: Path) -> None:
    job = JobSpec(4)
    job.drop_dump(2)
    seen: list[str] = []

    def heartbeat(path: str) -> int:
        seen.append(path)
        return T0 - 42 * 10**9

    rep = diagnose(Options(job_dir=job.write(tmp_path), host_key="x", heartbeat=heartbeat))
    assert seen == ["/dev/shm/hetobs-stats-job1-r2"]
    assert "last watchdog heartbeat was 42.0 s before the incident" in "\n".join(rep.verdicts[0].evidence)


def test_p2p_send_without_matching_recv(tmp_path: Path) -> None:
    """Rank 0 waits in send to rank 3 (p2p); rank 3 never posted the recv."""
    job = JobSpec(4, seconds=0.1)
    for r in range(4):
        job.dumps[r]["reason"] = "on_demand"
    send = make_in_flight(0, op="send", seconds=6.0, peers=[make_peer(3, sent=1, since_s=6.0)])
    send.update(collective_seq_id=0, p2p_seq_id=4, peer=3)
    job.comm(0)["in_flight"] = send
    job.comm(3)["in_flight"] = None
    job.dumps[3]["python"] = {"status": "ok", "stacks": stacks("compute_loss", "/app/train.py", 120)}
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_not_joined", [3])]
    text = "\n".join(rep.verdicts[0].evidence)
    assert "rank 0 has waited 6.0 s in send with rank 3 (p2p seq 4)" in text
    assert "compute_loss at train.py:120" in text


def test_p2p_matched_pair_is_not_a_fault(tmp_path: Path) -> None:
    job = JobSpec(4, seconds=0.1)
    send = make_in_flight(0, op="send", seconds=6.0)
    send.update(collective_seq_id=0, p2p_seq_id=4, peer=3)
    recv = make_in_flight(0, op="recv", seconds=6.0)
    recv.update(collective_seq_id=0, p2p_seq_id=4, peer=0)
    job.comm(0)["in_flight"], job.comm(3)["in_flight"] = send, recv
    rep = run(job.write(tmp_path))
    assert not [v for v in faults(rep) if v.kind == VerdictKind.RANK_NOT_JOINED]


def test_stopped_then_resumed_rank_is_unresponsive_at_the_incident(tmp_path: Path) -> None:
    """Rank 0 was stopped at the incident (no answer, peers waited on it), later resumed and exited
    cleanly: judged as of the incident, it was unresponsive."""
    job = JobSpec(3)
    job.dumps[0] = None
    d2 = job.dumps[2]
    d2["reason"] = "watchdog"
    d2["cause"] = "all_reduce seq 17 on comm 0: no progress for 1.1 s, waiting on rank 0 (host node0, pid 1000)"
    d2["side_channel"] = {"asked": [0, 1], "answered": [1], "unanswered": [0]}
    job.metas[0].update(exited_cleanly=True, exit_time_ns=T0 + 10**9)
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_unresponsive", [0])]
    assert "rank(s) 2 reported waiting on it" in "\n".join(rep.verdicts[0].evidence)


def test_exited_before_the_incident_without_complaints_is_not_blamed(tmp_path: Path) -> None:
    job = JobSpec(3, seconds=0.2)
    job.dumps[0] = None
    job.metas[0].update(exited_cleanly=True, exit_time_ns=T0 - 10**9)
    rep = run(job.write(tmp_path))
    assert faults(rep) == []


def test_timeout_chain_names_the_rank_waited_on(tmp_path: Path) -> None:
    """Only rank 1 dumped; rank 0 timed out earlier waiting on rank 1 and exited: last resort."""
    job = JobSpec(2, seq=4, incident="error-c0-s4")
    job.dumps[0] = None
    job.metas[0].update(exited_cleanly=True, exit_time_ns=T0 - 2 * 10**9)
    job.fail_all({1: "all_reduce seq 4 count 10 float32 sum on comm 0 failed at rank 1: aborted by rank 0 (host vm, "
                     "pid 6888): rank 0 timed out in all_reduce seq 3 count 10 float32 sum: aborted by the watchdog "
                     "(HETOBS_ABORT_ON_HANG=1): all_reduce seq 3 on comm 0: no progress for 1.1 s "
                     "(HETOBS_HANG_TIMEOUT=1), waiting on rank 1 (host vm, pid 6889)"})
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks, v.seq) for v in faults(rep)] == [("rank_not_joined", [1], 3)]
    assert rep.verdicts[0].confidence < 0.9


@pytest.mark.parametrize(("job", "incident", "verdicts"), [
    ("sleeping", "hang-c0-s5", [("rank_not_joined", [2])]),
    ("stopped", "hang-c0-s5", [("rank_unresponsive", [0])]),
    ("killed", "error-c0-s58", [("rank_dead", [2])]),
    ("ondemand-healthy", None, []),
    ("abort-on-hang", "hang-c0-s3", [("rank_not_joined", [1])]),
    ("abort-on-hang", "error-c0-s3", [("rank_not_joined", [1])]),
    ("link", None, [("link_stalled", [])]),
    ("mismatch-one-dump-missing", None, [("op_mismatch", [0])]),
])
def test_saved_native_watchdog_dumps(job: str, incident: str, verdicts: list) -> None:
    """Dumps the real native watchdog wrote: every case names exactly its culprit."""
    rep = run(SAVED / "native" / job, incident=incident, proc_root=Path("/nonexistent-proc"))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == verdicts
    if job == "link":
        assert rep.verdicts[0].links == [(0, 1)]
    assert rep.status == (Status.FAULT if verdicts else Status.HEALTHY)


def test_link_stalled_when_the_sender_already_moved_on(tmp_path: Path) -> None:
    """A blackholed connection: the sender finished seq 17 (its counters now show seq 18), the
    receiver still waits for the last frame of seq 17 from it."""
    job = JobSpec(3)
    c0 = job.comm(0)
    c0["last_coll_seq"] = 18
    c0["in_flight"] = make_in_flight(18, seconds=4.0, peers=[make_peer(1, sent=1, acked=0, since_s=4.0)])
    c0["links"] = [make_link(1, bytes_sent=4096)]
    job.dumps[0]["entries"].append(make_entry(18, rank=0, size=3, state="started"))
    job.comm(1)["in_flight"]["peers"] = [make_peer(0, sent=0, received=2, posted=3, since_s=5.0),
                                         make_peer(2, sent=3, received=0, posted=3, since_s=5.0)]
    job.comm(1)["links"] = [make_link(0, bytes_sent=1024)]
    job.comm(2)["in_flight"]["peers"] = [make_peer(1, sent=0, received=3, posted=4, since_s=5.0),
                                         make_peer(0, sent=4, received=0, posted=4, since_s=5.0)]
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.links) for v in faults(rep)] == [("link_stalled", [(0, 1)])]
    text = "\n".join(rep.verdicts[0].evidence)
    assert "rank 0 completed all_reduce seq 17 on comm 0 (it is at seq 18 now)" in text
    assert "received only 2 of the 3 frame(s)" in text
    assert "3072 bytes never arrived" in text
    assert "sent 1 frame(s) to rank 1 and 0 were acknowledged" in text


def test_mismatch_without_majority_in_dumps_uses_the_ranks_vote(tmp_path: Path) -> None:
    """Only two of three dumps exist (1 against 1); the core's vote in the causes names rank 0."""
    job = JobSpec(3, seq=7, incident="error-c0-s7")
    vote = ("op mismatch on comm 0: deviating rank 0 (rank 0 called all_reduce seq 7 count 8 float32 sum); ranks 1, 2 "
            "called all_reduce seq 7 count 262144 float32 sum (this rank: {r})")
    job.fail_all({r: vote.format(r=r) for r in (0, 1)})
    job.dumps[0]["entries"][-1]["count"] = 8
    job.dumps[2] = None
    job.metas[2].update(exited_cleanly=True, exit_time_ns=T0 - 10**8)
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("op_mismatch", [0])]
    assert "the ranks' own vote" in rep.verdicts[0].evidence[-1]


# --- waits across communicators (issue 10, item 1) ----------------------------------

def _chain_job(world: int, comms: dict[int, list[int]], waits: dict[int, tuple[int, float]],
               asleep: tuple[int, ...] = (), seq_of: Optional[dict[int, int]] = None, **kw: object) -> JobSpec:
    """`world` ranks, communicators {id: members}; rank r waits in comm `waits[r][0]` (its op at
    `seq_of[c]`, default 17 on comm 0 and 4 elsewhere) for `waits[r][1]` s; `asleep` ranks sit in
    Python (`preparing_next_batch`); every other op completed."""
    seq_of = {c: (17 if c == 0 else 4) for c in comms} | (seq_of or {})
    job = JobSpec(world, **kw)  # type: ignore[arg-type]
    for r in range(world):
        mine = [c for c, ms in sorted(comms.items()) if r in ms]
        job.metas[r]["comms"] = [{"comm_id": c, "size": len(comms[c]), "rank": comms[c].index(r),
                                  "global_ranks": comms[c], "ring": comms[c], "transports": {}} for c in mine]
        d = job.dumps[r]
        if d is None:
            continue
        d["comms"], d["entries"] = [], []
        for c in mine:
            s = seq_of[c]
            wait = waits.get(r)
            flight = make_in_flight(s, seconds=wait[1]) if wait is not None and wait[0] == c else None
            d["comms"].append(make_comm(c, comms[c], r, last_coll_seq=s - 1, in_flight=flight))
            d["entries"] += [make_entry(q, comm=c, rank=comms[c].index(r), size=len(comms[c]))
                             for q in range(max(1, s - 3), s)]
            if flight is not None:
                d["entries"].append(make_entry(s, comm=c, rank=comms[c].index(r), size=len(comms[c]),
                                               state="started"))
        if r in asleep:
            d["python"] = {"status": "ok", "stacks": stacks("preparing_next_batch", "/app/train.py", 31)}
    return job


SPLIT = {0: [0, 1, 2, 3], 1: [0, 2], 2: [1, 3]}  # comm.split(color=rank % 2) of a 4-rank world


@pytest.mark.parametrize("sub_wait_s", [5.0, 1.0])
def test_wait_chain_across_communicators_blames_only_its_end(tmp_path: Path, sub_wait_s: float) -> None:
    """Rank 3 sleeps before its op on sub-communicator 2, where rank 1 waits for it; ranks 0 and
    2 wait in the world's all_reduce for ranks 1 and 3. Only rank 3 is blamed, on comm 2, and
    the evidence shows rank 1 (and behind it ranks 0, 2) waiting. Rank 1's own wait may look
    younger than the stall time (its dump was taken a moment earlier): it is still a victim."""
    job = _chain_job(4, SPLIT, {0: (0, 5.0), 2: (0, 5.0), 1: (2, sub_wait_s)}, asleep=(3,))
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks, v.comm, v.seq) for v in faults(rep)] == [("rank_not_joined", [3], 2, 4)]
    assert blamed(rep) == {3}
    v = rep.verdicts[0]
    text = "\n".join(v.evidence)
    assert f"rank(s) 1 have waited for {sub_wait_s:.1f} s in all_reduce seq 4 on comm 2" in text
    assert ("behind it: rank(s) 0, 2 wait in all_reduce seq 17 on comm 0 for rank(s) 1, which are held in "
            "all_reduce seq 4 on comm 2") in text
    assert "rank 3 is also missing from all_reduce seq 17 on comm 0, where rank(s) 0, 2 wait" in text
    assert "preparing_next_batch at train.py:31" in text
    assert "rank(s) 0, 1, 2 wait behind it" in v.summary
    assert rep.exclude_hosts == ["node1"]
    row = next(x for x in rep.ranks if x.rank == 1)  # shown where it is held, waiting for rank 3
    assert (row.state, row.comm, row.waiting_on) == ("in_op", 2, [3])


def test_wait_chain_of_three_communicators(tmp_path: Path) -> None:
    """Rank 0 waits on rank 1 in comm 1, rank 1 on rank 2 in comm 2, rank 2 on rank 3 in comm 3;
    rank 3 sleeps. The end of the chain, rank 3 on comm 3, is the one culprit."""
    comms = {0: [0, 1, 2, 3], 1: [0, 1], 2: [1, 2], 3: [2, 3]}
    job = _chain_job(4, comms, {0: (1, 6.0), 1: (2, 5.5), 2: (3, 5.0)}, asleep=(3,))
    for r in range(4):  # the world comm is idle: everyone finished its seq 16
        job.comm(r, 0)["last_coll_seq"] = 17
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks, v.comm) for v in faults(rep)] == [("rank_not_joined", [3], 3)]
    text = "\n".join(rep.verdicts[0].evidence)
    assert "rank(s) 2 have waited for 5.0 s in all_reduce seq 4 on comm 3" in text
    assert "rank(s) 1 wait in all_reduce seq 4 on comm 2 for rank(s) 2, which are held in all_reduce seq 4 on " \
           "comm 3" in text
    assert "rank(s) 0 wait in all_reduce seq 4 on comm 1 for rank(s) 1, which are held in all_reduce seq 4 on " \
           "comm 2" in text
    assert "rank(s) 0, 1, 2 wait behind it" in rep.verdicts[0].summary


@pytest.mark.parametrize("state,kind", [("gone", "rank_dead"), ("T", "rank_unresponsive")])
def test_wait_chain_ending_in_a_dead_or_stopped_rank(tmp_path: Path, state: str, kind: str) -> None:
    """As the split case, but rank 3 was SIGKILLed (pid gone) or SIGSTOPped (state T): it is blamed
    as such, on the sub-communicator, and rank 1 waiting behind it in comm 2 is not."""
    procs = {1000 + r: ("S", 5000 + r) for r in range(3)}
    if state == "T":
        procs[1003] = ("T", 5003)
    proc = fake_proc(tmp_path / "proc", procs)
    job = _chain_job(4, SPLIT, {0: (0, 5.0), 2: (0, 5.0), 1: (2, 5.0)}, host_key=local_key(proc))
    job.drop_dump(3)
    rep = run(job.write(tmp_path), proc_root=proc, host_key=None)
    assert [(v.kind.value, v.ranks, v.comm, v.seq) for v in faults(rep)] == [(kind, [3], 2, 4)]
    text = "\n".join(rep.verdicts[0].evidence)
    assert "rank(s) 1 wait in all_reduce seq 4 on comm 2 (up to 5.0 s)" in text
    assert ("behind it: rank(s) 0, 2 wait in all_reduce seq 17 on comm 0 for rank(s) 1, which are held in "
            "all_reduce seq 4 on comm 2") in text


def test_wait_chain_ending_in_ranks_that_failed_after_a_death(tmp_path: Path) -> None:
    """Rank 3 died; rank 1 failed in comm 2 (its peer closed), ranks 0 and 2 failed in the world op.
    Rank 1, failed in comm 2 and so absent from comm 0, is a victim, not a culprit."""
    proc = fake_proc(tmp_path / "proc", {1000 + r: ("S", 5000 + r) for r in range(3)})
    job = _chain_job(4, SPLIT, {0: (0, 0.1), 2: (0, 0.1), 1: (2, 0.1)}, host_key=local_key(proc),
                     incident="error-c0-s17")
    job.drop_dump(3)
    closed = "{op} on comm {c} failed at rank {r}: rank 3 (host node1, pid 1003) closed its connection"
    for r, c, s in ((0, 0, 17), (2, 0, 17), (1, 2, 4)):
        d = job.dumps[r]
        cause = closed.format(op=f"all_reduce seq {s}", c=c, r=r)
        d["reason"], d["cause"] = "error", cause
        cv = job.comm(r, c)
        cv["failed"], cv["cause"], cv["in_flight"] = True, cause, None
        e = next(e for e in d["entries"] if e["comm_id"] == c and e["collective_seq_id"] == s)
        e["state"], e["error"] = "failed", cause
    rep = run(job.write(tmp_path), proc_root=proc, host_key=None)
    assert [(v.kind.value, v.ranks, v.comm) for v in faults(rep)] == [("rank_dead", [3], 2)]
    assert blamed(rep) == {3}
    text = "\n".join(rep.verdicts[0].evidence)
    assert "rank(s) 1 failed in all_reduce seq 4 on comm 2" in text
    assert "rank(s) 0, 2 wait in all_reduce seq 17 on comm 0 for rank(s) 1, which are held in all_reduce seq 4" in text


def test_chain_into_a_deadlock_stays_a_deadlock(tmp_path: Path) -> None:
    """Comms 1 and 2 wait on each other (ranks 0, 1 in comm 1 need 2, 3, who wait in comm 2 for
    0, 1); rank 4 waits in comm 3 for rank 0, held in that cycle. One deadlock verdict, with rank
    4 in its evidence as waiting behind it; no rank is blamed on its own."""
    comms = {0: [0, 1, 2, 3, 4], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3], 3: [4, 0]}
    job = _chain_job(5, comms, {0: (1, 6.0), 1: (1, 6.0), 2: (2, 6.0), 3: (2, 6.0), 4: (3, 6.0)},
                     seq_of={3: 2})
    for r in range(5):  # the world comm is idle
        job.comm(r, 0)["last_coll_seq"] = 17
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("deadlock", [0, 1, 2, 3])]
    v = rep.verdicts[0]
    assert "comm 1 -> comm 2 -> comm 1" in v.summary
    assert ("behind it: rank(s) 4 wait in all_reduce seq 2 on comm 3 for rank(s) 0, which are held in all_reduce "
            "seq 4 on comm 1") in "\n".join(v.evidence)


# --- blame from the abort notice's fields, not its text (issue 10, item 3) -------------

OPAQUE = "the text of this failure says nothing the diagnosis may read"


def _aborted(job: JobSpec, fields: dict[int, dict]) -> None:
    """Ranks failed in comm 0 with dump-1.1 `abort` fields and a cause text nobody can parse."""
    job.fail_all({r: OPAQUE for r in fields})
    for r, f in fields.items():
        job.dumps[r]["version"] = "1.1"
        job.comm(r)["abort"] = {"kind": f["kind"], "reporter": f.get("reporter", r), "suspect": f.get("suspect"),
                                "received_from": f.get("received_from"), "deviating": f.get("deviating", [])}


def test_abort_fields_name_the_peer_that_closed(tmp_path: Path) -> None:
    """Rank 2 died: ranks 1 and 3 saw it close (first-hand), rank 0 heard it from rank 1."""
    job = JobSpec(4, incident="error-c0-s17")
    job.drop_dump(2)
    _aborted(job, {1: {"kind": "peer_closed", "suspect": 2}, 3: {"kind": "peer_closed", "suspect": 2},
                   0: {"kind": "peer_closed", "reporter": 1, "suspect": 2, "received_from": 1}})
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_dead", [2])]
    assert "rank(s) 1, 3 saw it close its connection" in "\n".join(rep.verdicts[0].evidence)


def test_abort_fields_name_the_broken_link(tmp_path: Path) -> None:
    job = JobSpec(4, incident="error-c0-s17")
    _aborted(job, {1: {"kind": "transport", "suspect": 2},
                   **{r: {"kind": "transport", "reporter": 1, "suspect": 2, "received_from": 1} for r in (0, 2, 3)}})
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks, v.links) for v in faults(rep)] == [("transport_error", [], [(1, 2)])]


def test_abort_fields_carry_the_ranks_vote(tmp_path: Path) -> None:
    """Two of three dumps (1 against 1): the vote the ranks took names rank 0, as data."""
    job = JobSpec(3, seq=7, incident="error-c0-s7")
    _aborted(job, {r: {"kind": "mismatch", "suspect": 1 - r, "deviating": [0]} for r in (0, 1)})
    job.dumps[0]["entries"][-1]["count"] = 8
    job.dumps[2] = None
    job.metas[2].update(exited_cleanly=True, exit_time_ns=T0 - 10**8)
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks, v.seq) for v in faults(rep)] == [("op_mismatch", [0], 7)]


def test_abort_fields_win_over_the_text(tmp_path: Path) -> None:
    """The text names rank 3 (as an older core's message could); the fields say rank 2 closed."""
    job = JobSpec(4, incident="error-c0-s17")
    job.drop_dump(2)
    _aborted(job, {1: {"kind": "peer_closed", "suspect": 2}, 3: {"kind": "peer_closed", "suspect": 2},
                   0: {"kind": "peer_closed", "reporter": 1, "suspect": 2, "received_from": 1}})
    for r in (0, 1, 3):
        text = "all_reduce seq 17 on comm 0 failed at rank 1: rank 3 (host node1, pid 1003) closed its connection"
        job.dumps[r]["cause"] = job.comm(r)["cause"] = text
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_dead", [2])]


def test_the_default_incident_is_the_one_most_ranks_of_the_latest_event_dumped_into() -> None:
    from hetobs.diagnosis.loader import _latest_complete

    s = 1_000_000_000
    times = {"old-all": 0, "hang-c0-p4-r2": 100 * s + 2, "hang-c9-s4": 100 * s + 1, "hang-c0-p4-r0": 100 * s}
    dumps = {"old-all": 4, "hang-c0-p4-r2": 2, "hang-c9-s4": 4, "hang-c0-p4-r0": 2}
    # per-rank p2p incidents of one hang lose to the incident every rank shared ...
    assert _latest_complete(list(times), times, dumps) == "hang-c9-s4"
    # ... and an older event never wins over the latest, however many dumped into it
    dumps["hang-c9-s4"] = 3
    assert _latest_complete(list(times), times, dumps) == "hang-c9-s4"
    del times["hang-c9-s4"], dumps["hang-c9-s4"]
    assert _latest_complete(list(times), times, dumps) == "hang-c0-p4-r2"


def _link_down_at_neighbouring_ops(tmp_path: Path, apart_ns: int) -> Path:
    """Both ends of a blackholed link fail: rank 0 in all_reduce seq 4, rank 1 still in seq 3
    (it waited for the last ack of seq 3). Each dumps into its own op's incident, and the
    blackhole also cuts the side channel, so neither incident holds the other's dump (as
    tests/test_flaky_network.py's permanent blackhole made it, about 1 run in 10)."""
    link = ("link rank {a} (host vm, 198.18.0.{ha}:4445{a}) <-> rank {b} (host vm, 198.18.0.{hb}:4445{b}) is down: "
            "it broke (while this rank waited for an ack: connection closed) and could not be re-made within "
            "HETOBS_RECONNECT_TIMEOUT=3 s")
    job = JobSpec(2, seq=4, incident="error-c0-s4")
    job.fail_all({r: f"all_reduce seq 4 count 1 float32 max on comm 0 failed at rank {r}: "
                     + link.format(a=r, b=1 - r, ha=r + 1, hb=2 - r) for r in (0, 1)})
    for r in (0, 1):
        job.dumps[r]["side_channel"] = {"asked": [1 - r], "answered": [], "unanswered": [1 - r]}  # type: ignore[index]
        job.comm(r)["abort"] = {"kind": "transport", "reporter": r, "suspect": 1 - r, "received_from": None,
                                "deviating": []}  # as the native dump gives it
    late = job.copy()
    job.dumps[1] = None
    job_dir = job.write(tmp_path)
    d1 = late.dumps[1]
    assert d1 is not None
    d1.update(incident="error-c0-s3", time_ns=T0 + apart_ns,
              cause=str(d1["cause"]).replace("seq 4 count 1 float32 max", "seq 3 count 4194304 float32 sum"))
    d1["entries"] = [e for e in d1["entries"] if e["collective_seq_id"] <= 3]
    d1["entries"][-1].update(state="failed", error=d1["cause"])
    c = late.comm(1)
    c.update(last_coll_seq=2, cause=d1["cause"])
    (job_dir / "incidents" / "error-c0-s3").mkdir()
    (job_dir / "incidents" / "error-c0-s3" / "rank-1.json").write_text(json.dumps(d1))
    return job_dir


def test_a_link_down_seen_at_neighbouring_ops_is_the_link_not_a_silent_rank(tmp_path: Path) -> None:
    rep = run(_link_down_at_neighbouring_ops(tmp_path, apart_ns=200_000_000))
    assert [(v.kind.value, v.ranks, v.links) for v in faults(rep)] == [("transport_error", [], [(0, 1)])]
    assert rep.incident == "error-c0-s3"  # the latest; rank 0's dump comes from error-c0-s4
    assert any("rank(s) 0 left no dump in error-c0-s3" in n and "from error-c0-s4 is used" in n for n in rep.notes), \
        rep.notes
    assert not any("lies in" in p.problem for p in rep.data_problems), rep.data_problems


def test_an_error_dump_of_another_event_is_not_borrowed(tmp_path: Path) -> None:
    rep = run(_link_down_at_neighbouring_ops(tmp_path, apart_ns=60 * 10**9))  # a minute apart: another event
    assert rep.incident == "error-c0-s3"  # the latest
    assert not any("is used" in n for n in rep.notes), rep.notes
    assert not any(v.kind.value == "transport_error" for v in faults(rep)), faults(rep)  # rank 0 has no dump here


def test_rank_this_host_ran_in_an_earlier_boot_is_not_taken_for_alive(tmp_path: Path) -> None:
    """A rank file of this host name from before a reboot: its pid (alive now, equal start time)
    is another process, so the job does not look alive; a rank of this boot does."""
    import socket

    from hetobs.diagnosis.live import looks_alive
    from hetobs.diagnosis.loader import load_job

    proc = fake_proc(tmp_path / "proc", {1000 + r: ("S", 5000 + r) for r in range(2)})
    now = local_key(proc)
    earlier = "00000000-0000-4000-8000-000000000000:" + now.partition(":")[2]
    for key, alive in ((now, True), (earlier, False)):
        job = JobSpec(2, host_key=key, job=f"boot{alive}")
        job.dumps = {0: None, 1: None}  # no dump yet: the ranks' files are all there is to judge by
        for meta in job.metas.values():
            assert meta is not None
            meta["host"] = socket.gethostname()
        options = Options(job_dir=job.write(tmp_path), proc_root=proc, host_key=None)
        assert looks_alive(load_job(options), options) is alive
