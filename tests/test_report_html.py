"""`hetobs diagnose --html`: the incident page, loaded from disk in a real headless Chromium.

One real demo incident (4 ranks, rank 1 sleeps instead of joining) is rendered by the
library and by the CLI; Chromium loads each page from file://, dumps the DOM after the
page's script ran and takes a screenshot in the same run, and its console (stderr with
--enable-logging) must stay silent: the page logs nothing unless drawing fails, and a
blocked script (CSP) or an exception would be logged. A copy of the incident with a
hostile host name and stack checks that text from dumps never becomes markup.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _chromium import browse, needs_chromium
from hetobs.cli.main import app
from hetobs.demo.runner import run_demo
from hetobs.diagnosis import Options, diagnose
from hetobs.report_html import load_for_report, render_html

ISLANDS = Path(__file__).parent / "data" / "dumps" / "v1.1" / "islands"
HOSTILE = '</script><script>alert(1)</script><script>console.error("PWNED")</script><img/src=x/onerror=alert(2)>'
CULPRIT = 1


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    res = run_demo(world=4, fault="sleep", culprit=CULPRIT, hang_timeout=1.5,
                   workdir=tmp_path_factory.mktemp("jobs"))
    assert res.found_the_fault, [(v.kind.value, v.ranks) for v in res.report.verdicts]
    return res


def _page(report, options: Options, path: Path) -> Path:  # type: ignore[no-untyped-def]
    path.write_text(render_html(report, load_for_report(options, report)), encoding="utf-8")
    return path


def _scripts(dom: str) -> list[str]:
    return re.findall(r"<script\b[^>]*>", dom)


@needs_chromium
def test_demo_page_shows_the_culprit_in_chromium(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    page = _page(demo.report, Options(job_dir=demo.job_dir, job=demo.job), tmp_path / "demo.html")
    text = page.read_text()
    assert not re.search(r"""\b(?:src|href)\s*=|https://|url\(""", text), "the page must fetch nothing"
    b = browse(page, tmp_path)
    assert b.console == [], b.console
    assert 'data-rendered="ok"' in b.dom
    top = demo.report.verdicts[0]
    assert html.escape(top.summary) in b.dom
    # Drawn by the script: the culprit's mark on the ring, the zoom centred on it, its timeline row.
    assert re.search(r'<circle[^>]*class="blamed-mark"', b.dom)
    assert re.search(rf'<circle[^>]*class="rank" data-rank="{CULPRIT}"[^>]*>', b.dom)
    detail = re.search(r'<p class="detail" id="zoom-detail">([^<]*)</p>', b.dom)
    assert detail and detail.group(1).startswith(f"rank {CULPRIT} · not_joined · BLAMED"), detail
    row = re.search(rf'<text[^>]*class="blame-label" data-rank="{CULPRIT}"[^>]*>rank {CULPRIT} ', b.dom)
    assert row, "the culprit's timeline row is marked"
    assert f"never called seq {top.seq}" in b.dom
    assert b.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b.png.stat().st_size > 20_000


@needs_chromium
def test_hostile_text_from_dumps_stays_text(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job_dir = tmp_path / "jobs" / demo.job
    shutil.copytree(demo.job_dir, job_dir)
    for f in job_dir.rglob("rank-*.json"):
        doc = json.loads(f.read_text())
        doc["host"] = HOSTILE
        py = doc.get("python")
        if isinstance(py, dict) and isinstance(py.get("stacks"), str):
            py["stacks"] = py["stacks"].replace("preparing_next_batch", HOSTILE)
        f.write_text(json.dumps(doc))
    options = Options(job_dir=job_dir, job=demo.job)
    report = diagnose(options)
    assert any(HOSTILE in e for v in report.verdicts for e in v.evidence), "the payload reaches the evidence"
    page = _page(report, options, tmp_path / "hostile.html")
    assert _scripts(page.read_text()) == ['<script type="application/json" id="hetobs-data">', "<script>"]
    b = browse(page, tmp_path)
    assert b.console == [], b.console  # neither PWNED nor a CSP refusal
    assert 'data-rendered="ok"' in b.dom
    assert _scripts(b.dom) == ['<script type="application/json" id="hetobs-data">', "<script>"]
    assert "<img" not in b.dom
    assert html.escape(HOSTILE, quote=False) in b.dom, "the payload is shown as text"


@needs_chromium
def test_islands_drawn_as_groups(tmp_path: Path) -> None:
    shutil.copytree(ISLANDS, tmp_path / "islands")
    options = Options(job_dir=tmp_path / "islands", job="islands")
    page = _page(diagnose(options), options, tmp_path / "islands.html")
    b = browse(page, tmp_path)
    assert b.console == [], b.console
    names = re.findall(r'<text[^>]*class="island-name"[^>]*>([^<]*)</text>', b.dom)
    assert sorted(names) == ["alpha", "beta"], names
    assert "grouped by island" in b.dom


def test_cli_writes_the_page_with_the_json_verdicts(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "report.html"
    r = CliRunner().invoke(app, ["diagnose", "--job", demo.job, "--dir", str(demo.job_dir.parent), "--json",
                                 "--html", str(out)])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)  # stdout stays pure JSON
    page = out.read_text()
    assert doc["verdicts"]
    for v in doc["verdicts"]:
        assert html.escape(v["summary"]) in page
        assert html.escape(json.dumps(v, indent=2, ensure_ascii=False)) in page, "each verdict as --json gives it"
    assert "report.html" in r.stderr


def test_cli_html_into_a_missing_folder_is_a_usage_error(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(app, ["diagnose", "--job", demo.job, "--dir", str(demo.job_dir.parent),
                                 "--html", str(tmp_path / "no" / "such" / "report.html")])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [f"error: --html {tmp_path}/no/such/report.html: the folder "
                                             f"{tmp_path}/no/such does not exist"], r.stderr


def test_demo_cli_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "demo.html"
    r = CliRunner().invoke(app, ["demo", "--fault", "sleep", "--hang-timeout", "1.5", "--dir", str(tmp_path / "jobs"),
                                 "--json", "--html", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [(v["kind"], v["ranks"]) for v in doc["verdicts"]][:1] == [("rank_not_joined", [1])]
    assert html.escape(doc["verdicts"][0]["summary"]) in out.read_text()


def _scale_bench():  # type: ignore[no-untyped-def]
    """bench/diagnose_scale.py, whose writers make synthetic incidents at any size."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("diagnose_scale", Path(__file__).parents[1] / "bench" /
                                                  "diagnose_scale.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_html_from_flight_recorder_dumps(tmp_path: Path) -> None:
    _scale_bench().write_fr(tmp_path / "fr", 8, 5, 12, False)
    out = tmp_path / "fr.html"
    r = CliRunner().invoke(app, ["diagnose", "--fr", str(tmp_path / "fr" / "json"), "--json", "--html", str(out)])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert [(v["kind"], v["ranks"]) for v in doc["verdicts"]][:1] == [("rank_not_joined", [5])]
    page = out.read_text()
    assert html.escape(doc["verdicts"][0]["summary"]) in page
    assert '"blamed":[5]' in page


@needs_chromium
def test_many_ranks_are_aggregated(tmp_path: Path) -> None:
    """512 ranks: the ring is drawn as arcs per run of one state, the timeline keeps the blamed part."""
    world, culprit = 512, 170
    _scale_bench().write_hetobs(tmp_path / "jobs", "scale", world, culprit, 10)
    options = Options(job_dir=tmp_path / "jobs" / "scale", job="scale")
    report = diagnose(options)
    page = _page(report, options, tmp_path / "scale.html")
    assert page.stat().st_size < 200_000  # per-rank columns, not per-rank markup
    b = browse(page, tmp_path)
    assert b.console == [], b.console
    ring = re.search(r'<svg[^>]*id="ring-svg".*?</svg>', b.dom, re.S)
    assert ring is not None
    assert 'class="rank"' not in ring.group(0)
    assert len(re.findall(r"<path ", ring.group(0))) <= 4  # in_op | not_joined | in_op
    assert re.search(r'<circle[^>]*class="blamed-mark"', ring.group(0))
    rows = re.findall(r'<text x="20"[^>]*data-rank="(\d+)"', b.dom)
    assert [int(r) for r in rows] == list(range(culprit - 2, culprit + 3)), rows
    detail = re.search(r'id="zoom-detail">([^<]*)<', b.dom)
    assert detail and detail.group(1).startswith(f"rank {culprit} · not_joined · BLAMED"), detail


@needs_chromium
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None, reason="the link fault needs root and "
                                                                                   "iptables")
def test_blamed_link_is_drawn(tmp_path: Path) -> None:
    res = run_demo(world=3, fault="link", culprit=0, hang_timeout=1.5, workdir=tmp_path / "jobs")
    assert res.found_the_fault and res.link is not None
    page = _page(res.report, Options(job_dir=res.job_dir, job=res.job), tmp_path / "link.html")
    b = browse(page, tmp_path)
    assert b.console == [], b.console
    src, dst = res.link
    ring = re.search(r'<svg[^>]*id="ring-svg".*?</svg>', b.dom, re.S)
    assert ring and re.search(r'<line[^>]*class="blamed-link"', ring.group(0))
    assert f"link {src}→{dst}" in ring.group(0)
    assert not re.search(r'<circle[^>]*class="blamed-mark"', ring.group(0)), "a link verdict blames no rank"
    zoom = re.search(r'<svg[^>]*id="zoom-svg".*?</svg>', b.dom, re.S)
    assert zoom and ">blamed link<" in zoom.group(0)
