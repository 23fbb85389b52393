"""Synthetic dumps (no processes) for issue 28's verdicts: a link that could not be re-made
between live ranks (`transport_error`, its direction from the ends' reconnect records) and a
host whose every rank is silent (one verdict for the host). The same cases on real namespaces:
tests/test_reset_bursts.py and tests/test_frozen_host.py."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any, Optional

import pytest

from diagnosis_factory import T0, JobSpec
from hetobs.diagnosis import Options, diagnose


def run(job_dir: Path) -> Any:
    return diagnose(Options(job_dir=job_dir, host_key="not-this-host"))


def faults(report: Any) -> list:
    return [v for v in report.verdicts if v.kind.is_fault]


# How a dump writes a reconnect event: "fields" as the runtime does now (stage, errno, refused_ns;
# the sentence blanked, so only the fields can decide), "text" as dumps before them (the sentence only).
FORMS = ["fields", "text"]
REFUSED, TIMED_OUT = errno.ECONNREFUSED, errno.ETIMEDOUT


def _event(form: str, t: int, what: str, stage: str, err: int = 0, refused_s: float = 0.0) -> dict[str, Any]:
    if form == "text":
        return {"time_ns": t, "what": what}
    return {"time_ns": t, "stage": stage, "errno": err, "refused_ns": int(refused_s * 1e9), "what": ""}


def _record(form: str, state: str, *events: tuple[Any, ...]) -> dict[str, Any]:
    """A link's reconnect record; each event is (what, stage, errno, seconds refused)."""
    return {"state": state, "breaks": 1, "attempts": len(events),
            "events": [_event(form, T0 - 1000 + k, *e) for k, e in enumerate(events)]}


GONE = ("all_reduce seq 4 count 1 float32 sum on comm 0 failed at rank 0: rank 1 (host node1, pid 1001) is gone: "
        "its listener at 10.0.0.2:40001 refuses connections")
DOWN = ("all_reduce seq 4 count 1 float32 sum on comm 0 failed at rank 1: link rank 1 (host node1, 10.0.0.2:5) <-> "
        "rank 0 (host node0, 10.0.0.1:40000) is down: it broke (while this rank waited for an ack: Connection timed "
        "out) and could not be re-made within HETOBS_RECONNECT_TIMEOUT=3 s (2 attempts; last: dial: ...)")


def _broken_link(tmp_path: Path, records: dict[int, Optional[dict[str, Any]]], drop: Optional[int] = None) -> Path:
    """Two ranks on two hosts, both failed on their one TCP link: rank 0 found rank 1 "gone"
    (refused for 1.5 s), rank 1 gave up re-making the link."""
    job = JobSpec(2, seq=4, incident="error-c0-s4")
    for r in (0, 1):
        job.metas[r]["host"] = job.dumps[r]["host"] = f"node{r}"  # type: ignore[index]
    job.fail_all({0: GONE, 1: DOWN})
    job.comm(0)["abort"] = {"kind": "peer_closed", "reporter": 0, "suspect": 1, "received_from": None, "deviating": []}
    job.comm(1)["abort"] = {"kind": "transport", "reporter": 1, "suspect": 0, "received_from": None, "deviating": []}
    for r in (0, 1):
        job.comm(r)["links"] = [{"peer": 1 - r, "global_peer": 1 - r, "transport": "tcp", "bytes_sent": 1 << 20,
                                 "bytes_recv": 1 << 20, "busy_ns": 1, "last_activity_ns": T0, "reconnects": 0,
                                 "tcp": None, "reconnect": records.get(r)}]
    if drop is not None:
        job.drop_dump(drop)
    return job.write(tmp_path)


@pytest.mark.parametrize("form", FORMS)
def test_a_peer_called_gone_that_left_a_dump_is_a_link_fault_with_its_direction(tmp_path: Path, form: str) -> None:
    rep = run(_broken_link(tmp_path, {
        0: _record(form, "closed", ("broke: receiving data: Connection reset by peer", "broke"),
                   ("probe: cannot connect to rank 1 at 10.0.0.2:40001: Connection refused after 32 attempts",
                    "probe", REFUSED, 1.5)),
        1: _record(form, "down", ("broke: while this rank waited for an ack: Connection timed out", "broke"),
                   ("dial: cannot connect to rank 0 at 10.0.0.1:40000: Connection timed out after 2 attempts", "dial",
                    TIMED_OUT),
                   ("gave up after HETOBS_RECONNECT_TIMEOUT=3 s", "end"))}))
    assert [(v.kind.value, v.ranks, v.links) for v in faults(rep)] == [("transport_error", [], [(0, 1)])]
    v = faults(rep)[0]
    assert "packets from rank 0 to rank 1" in v.summary, v.summary
    if form == "text":
        assert any("Connection refused" in e for e in v.evidence) and any("gave up" in e for e in v.evidence), \
            v.evidence
    else:  # the sentences were left out: the evidence says what the fields say
        assert "rank 0: probe: ECONNREFUSED (refused for 1.5 s)" in v.evidence, v.evidence
        assert "rank 1: dial: ETIMEDOUT" in v.evidence, v.evidence
    assert rep.exclude_hosts == ["node0", "node1"], rep.exclude_hosts  # a link names the hosts at its ends


@pytest.mark.parametrize("form", FORMS)
def test_resets_refused_at_both_ends_name_both_directions(tmp_path: Path, form: str) -> None:
    refused = "dial: cannot connect to rank {p} at 10.0.0.{h}:4000{p}: Connection refused after 9 attempts"
    rep = run(_broken_link(tmp_path, {
        0: _record(form, "closed", ("broke: sending data: Connection reset by peer", "broke"),
                   (refused.format(p=1, h=2), "dial", REFUSED, 0.2)),
        1: _record(form, "down", ("broke: sending data: Connection reset by peer", "broke"),
                   (refused.format(p=0, h=1), "dial", REFUSED, 0.2))}))
    assert [(v.kind.value, v.ranks, sorted(v.links)) for v in faults(rep)] == \
        [("transport_error", [], [(0, 1), (1, 0)])]


@pytest.mark.parametrize("form", FORMS)
def test_unanswered_attempts_at_both_ends_leave_the_direction_open(tmp_path: Path, form: str) -> None:
    timed_out = "dial: cannot connect to rank {p} at 10.0.0.{h}:4000{p}: Connection timed out after 2 attempts"
    broke = ("broke: while this rank waited for an ack: Connection timed out", "broke")
    rep = run(_broken_link(tmp_path, {
        0: _record(form, "down", broke, (timed_out.format(p=1, h=2), "dial", TIMED_OUT)),
        1: _record(form, "down", broke, (timed_out.format(p=0, h=1), "dial", TIMED_OUT))}))
    v = faults(rep)[0]
    assert (v.kind.value, v.ranks, sorted(v.links)) == ("transport_error", [], [(0, 1), (1, 0)])
    assert "cannot be told" in v.summary, v.summary


def test_the_fields_decide_not_the_words(tmp_path: Path) -> None:
    """Events that carry their fields are read by them alone: a sentence that says "refused" about
    an attempt whose errno is not ECONNREFUSED (the handshake's key refused) is no refusal, and an
    ECONNREFUSED whose sentence never says so is one."""
    rep = run(_broken_link(tmp_path, {
        0: {"state": "down", "breaks": 1, "attempts": 2, "events": [
            {"time_ns": T0 - 2000, "stage": "broke", "errno": 0, "refused_ns": 0, "what": "broke: refused"},
            {"time_ns": T0 - 1000, "stage": "end", "errno": 0, "refused_ns": 0,
             "what": "handshake refused: bad HMAC"}]},
        1: {"state": "down", "breaks": 1, "attempts": 2, "events": [
            {"time_ns": T0 - 1000, "stage": "dial", "errno": REFUSED, "refused_ns": 1_500_000_000,
             "what": "dial: it did not work"}]}}))
    assert [(v.kind.value, v.ranks, v.links) for v in faults(rep)] == [("transport_error", [], [(1, 0)])]


def test_a_peer_called_gone_without_a_dump_is_not_a_link_fault(tmp_path: Path) -> None:
    """No dump: it may really be dead, and reachability judges it, not the link."""
    rep = run(_broken_link(tmp_path, {0: _record("text", "closed", ("broke: x", "broke"),
                                                 ("probe: ... Connection refused ...", "probe", REFUSED))}, drop=1))
    assert not any(v.kind.value == "transport_error" for v in faults(rep)), faults(rep)
    assert [v.ranks for v in faults(rep)] == [[1]], faults(rep)


def _hosts_job(silent: list[int]) -> JobSpec:
    """Four ranks, two per host (host keys differ), stuck in one all_reduce; `silent` left no dump."""
    job = JobSpec(4)
    for r in range(4):
        meta = job.metas[r]
        assert meta is not None
        meta["host"], meta["host_key"] = f"node{r // 2}", f"boot-{r // 2}:4026531840"
    for r in silent:
        job.drop_dump(r)
    return job


def test_every_rank_of_a_host_silent_is_one_verdict_for_the_host(tmp_path: Path) -> None:
    rep = run(_hosts_job([2, 3]).write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_unresponsive", [2, 3])], faults(rep)
    v = faults(rep)[0]
    assert "host node1" in v.summary, v.summary
    assert rep.exclude_hosts == ["node1"], rep.exclude_hosts


def test_one_silent_rank_of_a_host_stays_a_rank_verdict(tmp_path: Path) -> None:
    rep = run(_hosts_job([3]).write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in faults(rep)] == [("rank_unresponsive", [3])], faults(rep)
    assert faults(rep)[0].summary.startswith("rank 3 "), faults(rep)[0].summary


@pytest.mark.parametrize("form", FORMS)
def test_refusals_after_the_peer_failed_do_not_count_for_the_direction(tmp_path: Path, form: str) -> None:
    """Host 1 resets what reaches it: rank 0's probes are refused (1.5 s, then "gone"), rank 0 fails
    and exits; only then are rank 1's dials refused, by a host whose rank 0 no longer listens."""
    job_dir = _broken_link(tmp_path, {
        0: {"state": "closed", "breaks": 1, "attempts": 33, "events": [
            _event(form, T0 - 3_000_000_000, "broke: receiving data: Connection reset by peer", "broke"),
            _event(form, T0 - 1_500_000_000, "probe: cannot connect to rank 1 at 10.0.0.2:40001: Connection refused "
                                             "after 33 attempts (gave up: refused throughout: nothing listens there)",
                   "probe", REFUSED, 1.5)]},
        1: {"state": "closed", "breaks": 1, "attempts": 21, "events": [
            _event(form, T0 - 3_000_000_000, "broke: sending data: Connection reset by peer", "broke"),
            _event(form, T0, "dial: cannot connect to rank 0 at 10.0.0.1:40000: Connection refused after 21 "
                             "attempts (gave up: the connect deadline)", "dial", REFUSED, 0.5)]}})
    d0 = job_dir / "incidents" / "error-c0-s4" / "rank-0.json"
    doc = json.loads(d0.read_text())
    doc["time_ns"] = T0 - 1_400_000_000  # rank 0 failed (and dumped) right after calling rank 1 gone
    d0.write_text(json.dumps(doc))
    rep = run(job_dir)
    assert [(v.kind.value, v.ranks, v.links) for v in faults(rep)] == [("transport_error", [], [(0, 1)])]
