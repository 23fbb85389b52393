"""Dump format 2.1 (issue 30): `cause_info` and `in_flight.waiting_on` as the runtime writes them,
and the diagnosis reading those fields instead of the sentences beside them.

The defect this fixes: a watchdog names every peer it waits on ("waiting on rank 1 (...), rank
2 (...)"), but the diagnosis read only the first; a rank that waits on two peers (all_to_all,
relay) lost the second from its evidence."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _blank import blank_dump, verdict_keys
from _launch import shm_entries
from diagnosis_factory import JobSpec, make_cause_info
from hetobs.diagnosis import Options, diagnose
from hetobs.diagnosis.causes import CauseKind, cause_from_fields, parse_cause, waited_on
from hetobs.diagnosis.confidence import CONFIDENCE, confidence, majority_confidence
from hetobs.diagnosis.summary import CauseInfo
from hetobs.diagnosis.types import VerdictKind

WAITING_TWO = ("all_to_all seq 2 on comm 0: no progress for 1.6 s (HETOBS_HANG_TIMEOUT=1.5), waiting on "
               "rank 1 (host vm, pid 6889), rank 2 (host vm, pid 6890)")


def run(job_dir: Path) -> Any:
    return diagnose(Options(job_dir=job_dir, host_key="not-this-host"))


def evidence_of(report: Any, rank: int) -> str:
    return "\n".join(e for v in report.verdicts if rank in v.ranks for e in v.evidence)


# --- the text of older dumps: every peer of the list -------------------------------------

def test_waited_on_reads_every_peer_of_a_watchdog_list() -> None:
    assert waited_on(WAITING_TWO) == [1, 2]
    assert waited_on("x: no progress for 3.0 s, waiting on rank 4, rank 7") == [4, 7]  # the NCCL interposer's
    assert waited_on("timed out after 1.00 s receiving from rank 1 (host a, pid 1) (0 of 8 bytes; no progress); "
                     "sending to rank 3 (host b, pid 2) (0 of 8 bytes; no progress)") == [1, 3]
    assert waited_on("x: no progress for 3.0 s, waiting on no peer (local)") == []
    assert parse_cause("rank 0 timed out in all_to_all seq 2: timed out after 1.00 s " + WAITING_TWO).culprits == [1, 2]


def _two_peer_job(version: str, *, text: str, fields: bool) -> JobSpec:
    """3 ranks, all_to_all seq 2: rank 0's watchdog waits on ranks 1 and 2, which left no dump."""
    job = JobSpec(3, seq=2, incident="hang-c0-s2")
    job.drop_dump(1)
    job.drop_dump(2)
    d0 = job.dumps[0]
    d0.update(version=version, reason="watchdog", cause=text)
    f = job.comm(0)["in_flight"]
    f["op"] = "all_to_all"
    if fields:
        d0["cause_info"] = make_cause_info("hang", [1, 2], reporter=0, op="all_to_all", seq=2)
        f["waiting_on"] = [{"rank": 1, "direction": "recv", "posted": 1, "done": 0},
                           {"rank": 2, "direction": "recv", "posted": 1, "done": 0}]
    else:
        d0.pop("cause_info", None)
        f.pop("waiting_on", None)
    return job


@pytest.mark.parametrize("version,text,fields", [("2.0", WAITING_TWO, False), ("2.1", WAITING_TWO, True),
                                                 ("2.1", "", True)])
def test_a_rank_waiting_on_two_peers_is_evidence_against_both(tmp_path: Path, version: str, text: str,
                                                              fields: bool) -> None:
    rep = run(_two_peer_job(version, text=text, fields=fields).write(tmp_path))
    blamed = sorted(r for v in rep.verdicts if v.kind.is_fault for r in v.ranks)
    assert blamed == [1, 2], verdict_keys(rep)
    for r in (1, 2):
        assert "rank(s) 0 reported waiting on it" in evidence_of(rep, r), (r, evidence_of(rep, r))


def test_the_fields_win_over_the_text(tmp_path: Path) -> None:
    """A 2.1 dump's fields are read, its text not: a sentence naming another rank changes nothing."""
    job = _two_peer_job("2.1", text="all_to_all seq 2 on comm 0: no progress, waiting on rank 0 (host x, pid 1)",
                        fields=True)
    rep = run(job.write(tmp_path))
    for r in (1, 2):
        assert "rank(s) 0 reported waiting on it" in evidence_of(rep, r)


# --- causes from the fields, with no text at all ------------------------------------------

def _failed(job: JobSpec, infos: dict[int, dict[str, Any]]) -> None:
    """Ranks failed in comm 0 with 2.1 cause_info and no text at all."""
    job.fail_all({r: "" for r in infos})
    for r, info in infos.items():
        job.dumps[r]["cause_info"] = info
        job.comm(r)["cause_info"] = info


def test_a_closed_peer_is_named_from_the_fields_alone(tmp_path: Path) -> None:
    job = JobSpec(4, incident="error-c0-s17")
    job.drop_dump(2)
    _failed(job, {1: make_cause_info("peer_closed", [2], reporter=1, peer=2),
                  3: make_cause_info("peer_closed", [2], reporter=3, peer=2),
                  0: make_cause_info("peer_closed", [2], reporter=1, messengers=[1], peer=2)})
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in rep.verdicts if v.kind.is_fault] == [("rank_dead", [2])]
    assert "saw it close its connection" in evidence_of(rep, 2)


def test_the_vote_is_read_from_the_fields_alone(tmp_path: Path) -> None:
    job = JobSpec(3, incident="error-c0-s17")
    _failed(job, {r: make_cause_info("mismatch", [2], reporter=r, op="all_reduce", seq=17) for r in range(3)})
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks) for v in rep.verdicts if v.kind.is_fault] == [("op_mismatch", [2])]


def test_a_gone_peer_that_dumped_is_a_broken_link_from_the_fields_alone(tmp_path: Path) -> None:
    """Rank 1 called rank 2 gone (its listener refused every redial), but rank 2 left a dump of the
    incident: it was alive, so the link broke. 1.x/2.0 tell "gone" only by the sentence."""
    job = JobSpec(3, incident="error-c0-s17")
    told = make_cause_info("peer_closed", [2], reporter=1, messengers=[1], peer=2)
    _failed(job, {1: make_cause_info("peer_closed", [2], reporter=1, peer=2, gone=True), 0: told, 2: told})
    rep = run(job.write(tmp_path))
    assert [(v.kind.value, v.ranks, v.links) for v in rep.verdicts if v.kind.is_fault] == \
        [("transport_error", [], [(1, 2)])]
    job.comm(1)["cause_info"]["gone"] = job.dumps[1]["cause_info"]["gone"] = False  # a plain close: not a link
    rep = run(job.write(tmp_path / "plain"))
    assert not [v for v in rep.verdicts if v.kind.value == "transport_error"]


def test_cause_kind_is_an_enum_with_the_dumps_words() -> None:
    info = CauseInfo("timeout", (1, 2), 0, (), "all_reduce", 4, 1)
    c = cause_from_fields(info, "")
    assert c.kind is CauseKind.TIMEOUT and c.kind == "timeout" and str(c.kind) == "timeout"
    assert (c.culprits, c.reporter, c.op, c.seq) == ([1, 2], 0, "all_reduce", 4)
    assert "timeout" in c.text() and "1, 2" in c.text()  # a sentence for people even without one
    assert CauseKind.of("something new") is CauseKind.OTHER
    assert json.dumps({"k": CauseKind.PEER_CLOSED}) == '{"k": "peer_closed"}'


def test_every_verdict_kind_has_its_confidences_in_the_table() -> None:
    assert set(CONFIDENCE) == set(VerdictKind)
    for kind, table in CONFIDENCE.items():
        assert table and all(0.0 < x <= 1.0 for x in table.values()), kind
    assert confidence(VerdictKind.DEADLOCK, "cycle") == 0.9
    assert majority_confidence(1.0) == 0.95 and majority_confidence(0.6) == pytest.approx(0.8)


# --- what the runtime writes ------------------------------------------------------------------

def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_all_to_all_waiting_on_two_stopped_peers(launcher: Any, transport: str, tmp_path: Path) -> None:
    """Rank 0 waits in an all_to_all on ranks 1 and 2, both stopped: its 2.1 dump lists both in
    `waiting_on` and `cause_info.culprits`, its sentence names both, and `hetobs diagnose --json`
    blames both with rank 0's wait in the evidence of each, with the sentences or without."""
    before = shm_entries()
    job = launcher("two_peer_hang", 3, {}, transport=transport, timeout=60.0, deadline=90.0,
                   env={"HETOBS_HANG_TIMEOUT": "1.5", "HETOBS_DEBUG": "ERROR"})
    try:
        for r in range(3):
            job.wait_event(r, "armed", timeout=60)
        job_dir = job.hetobs_dir / job.job_id
        end = time.monotonic() + 45
        found: list[Path] = []
        while not found and time.monotonic() < end:  # rank 0's dump appears by rename: polled
            found = list(job_dir.glob("incidents/hang-*/rank-0.json"))
            if not found:
                time.sleep(0.1)
        assert found, "rank 0 wrote no hang dump"
        assert _stopped(job.pids[1]) and _stopped(job.pids[2])
    finally:
        job.kill()  # post-mortem, as a scheduler leaves it
        for name in job.shm_leftovers(before):
            (Path("/dev/shm") / name).unlink(missing_ok=True)
    d = json.loads(found[0].read_text())
    assert d["version"] == "2.1" and d["reason"] == "watchdog"
    info = d["cause_info"]
    assert (info["kind"], sorted(info["culprits"]), info["reporter"], info["op"]) == ("hang", [1, 2], 0, "all_to_all")
    f = next(c["in_flight"] for c in d["comms"] if c["in_flight"])
    assert {w["rank"] for w in f["waiting_on"]} == {1, 2}, f["waiting_on"]
    assert all(w["direction"] in ("send", "recv") and w["posted"] > w["done"] for w in f["waiting_on"])
    assert waited_on(d["cause"]) == [1, 2], d["cause"]

    def cli(job_root: Path) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job.job_id, "--dir",
                               str(job_root), "--json"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        return json.loads(proc.stdout)

    blind_root = tmp_path / "blind"
    blind = blind_root / job.job_id
    blind.parent.mkdir()
    shutil.copytree(job_dir, blind)
    for p in blind.glob("incidents/*/rank-*.json"):
        doc = json.loads(p.read_text())
        blank_dump(doc)
        p.write_text(json.dumps(doc))
    for rep in (cli(job.hetobs_dir), cli(blind_root)):
        faults = [v for v in rep["verdicts"] if v["kind"] not in ("straggler", "slow_link")]
        assert sorted(r for v in faults for r in v["ranks"]) == [1, 2], faults
        for r in (1, 2):
            ev = "\n".join(e for v in faults if r in v["ranks"] for e in v["evidence"])
            assert "rank(s) 0 reported waiting on it" in ev, (r, ev)
