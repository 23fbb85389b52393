"""Saved real incidents of dump formats 2.0 and 2.1 (issue 30): written by the runtime
(tests/data/dumps/save_real.py), frozen, and still loading and naming their culprit as the
reader evolves. The 2.1 ones also give the same verdicts with every sentence blanked.

Judged as from another host (nothing of this machine's /proc applies to saved files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _blank import blank_job, verdict_keys
from hetobs.diagnosis import Options, diagnose
from hetobs.diagnosis.causes import parse_cause, waited_on

SAVED = Path(__file__).resolve().parent / "data" / "dumps"
CASES = sorted(p.parent for v in ("v2.0", "v2.1") for p in (SAVED / v).glob("*/fault.json"))
# What each fault may be called from the files alone: a killed rank is dead (its peers saw it
# close), a stopped one unresponsive (it answered no one).
KINDS = {"kill": "rank_dead", "stop": "rank_unresponsive", "sleep": "rank_not_joined", "mismatch": "op_mismatch",
         "deadlock": "deadlock"}


def _judge(job_dir: Path) -> Any:
    return diagnose(Options(job_dir=job_dir, host_key="saved-elsewhere:0"))


def test_every_format_and_fault_is_saved() -> None:
    got = {(c.parent.name, c.name) for c in CASES}
    assert got == {(v, f) for v in ("v2.0", "v2.1") for f in KINDS}, sorted(got)


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_saved_incident_names_its_culprit(case: Path) -> None:
    fault = json.loads((case / "fault.json").read_text())
    version = case.parent.name[1:]
    assert {json.loads(p.read_text())["version"] for p in case.glob("incidents/*/rank-*.json")} == {version}
    report = _judge(case)
    assert not [p for p in report.data_problems if "version" in p.problem or "schema" in p.problem]
    faults = [v for v in report.verdicts if v.kind.is_fault]
    assert faults and faults[0].kind.value == KINDS[fault["fault"]], verdict_keys(report)
    assert fault["culprit"] in faults[0].ranks, verdict_keys(report)
    if fault["fault"] not in ("deadlock",):
        assert {r for v in faults for r in v.ranks} == {fault["culprit"]}, verdict_keys(report)


@pytest.mark.parametrize("case", [c for c in CASES if c.parent.name == "v2.1"], ids=lambda p: p.name)
def test_saved_2_1_incident_is_judged_the_same_without_text(case: Path, tmp_path: Path) -> None:
    blind = tmp_path / case.name
    assert blank_job(case, blind) > 0
    assert verdict_keys(_judge(blind)) == verdict_keys(_judge(case))


@pytest.mark.parametrize("case", [c for c in CASES if c.parent.name == "v2.1"], ids=lambda p: p.name)
def test_the_text_parsers_agree_with_the_fields_on_real_messages(case: Path) -> None:
    """The regexes kept for older dumps (causes.py) read the runtime's real sentences as its
    fields say: every waited-on rank of a watchdog's list, a failure's kind and culprits."""
    checked = 0
    for path in sorted(case.glob("incidents/*/rank-*.json")):
        d = json.loads(path.read_text())
        info = d["cause_info"]
        if d["reason"] == "watchdog":
            assert info["kind"] == "hang" and waited_on(d["cause"]) == sorted(info["culprits"]), (path, d["cause"])
            checked += 1
        for c in d["comms"]:
            if not c["failed"] or c["cause_info"] is None or c["cause_info"]["kind"] == "other":
                continue
            parsed = parse_cause(c["cause"])
            assert parsed is not None, c["cause"]
            assert (parsed.kind.value, sorted(parsed.culprits)) == \
                (c["cause_info"]["kind"], sorted(c["cause_info"]["culprits"])), (path, c["cause"], c["cause_info"])
            checked += 1
    assert checked, "no watchdog or error dump in the incident"
