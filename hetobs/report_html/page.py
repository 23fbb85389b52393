"""`render_html(report, job) -> str`: one self-contained HTML file of an incident.

The verdicts, their evidence, the unusual ranks, data problems and notes are plain
HTML (readable without the script); the pictures are drawn by one inline script
(_script.py) from one JSON data block (model.py). Nothing is fetched: no CDN, no
fonts, no images; the Content-Security-Policy forbids any fetch and allows only our
own script, by hash.

Every string from a dump (hosts, stacks, causes, evidence quoting them) is untrusted:
HTML text goes through `html.escape`, the data block's JSON has `<`, `>` and `&`
written as \\u escapes so no `</script>` can end it early, and the script writes text
with textContent only.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections import Counter
from typing import Any, Optional

from ..diagnosis.job import LoadedJob
from ..diagnosis.types import RankState, Report, Verdict
from ._script import SCRIPT
from ._style import STYLE
from .model import build_view

__all__ = ["render_html", "MAX_RANK_ROWS"]

MAX_RANK_ROWS = 64
_MAX_PROBLEMS = 50


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value), quote=True)


def _json_for_script(data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _csp_hash(source: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()


def _who(v: Verdict) -> str:
    parts = []
    if v.ranks:
        parts.append("rank " + ", ".join(str(r) for r in v.ranks[:16]) + (" …" if len(v.ranks) > 16 else ""))
    if v.links:
        parts.append("link " + ", ".join(f"{s} → {d}" for s, d in v.links[:16]))
    return "; ".join(parts) or "-"


def _verdict(i: int, v: Verdict) -> str:
    cls = "fault" if v.kind.is_fault else "advisory"
    where = " ".join(f"{k} {_e(x)}" for k, x in (("comm", v.comm), ("seq", v.seq), ("op", v.op)) if x is not None)
    evidence = "".join(f"<li>{_e(line)}</li>" for line in v.evidence)
    as_json = _e(json.dumps(v.to_dict(), indent=2, ensure_ascii=False))
    return (f'<div class="verdict {cls}" data-kind="{_e(v.kind.value)}">'
            f'<h3>{i}. <span class="kind">{_e(v.kind.value)}</span> '
            f'<span class="who">{_e(_who(v))}</span></h3>'
            f'<p class="summary">{_e(v.summary)}</p>'
            f'<p class="meta">{where} · confidence {v.confidence:.2f}</p>'
            f'<ul class="evidence">{evidence}</ul>'
            f'<details><summary>as <code>--json</code> gives it</summary><pre>{as_json}</pre></details></div>')


def _rank_rows(ranks: list[RankState], view: dict[str, Any]) -> str:
    """Unusual ranks only, at scale (the common state is counted), as the CLI's table does."""
    if not ranks:
        return "<p>no per-rank state</p>"
    common = Counter((r.comm, r.op, r.seq, r.state) for r in ranks)
    usual = common.most_common(1)[0][0] if len(ranks) > MAX_RANK_ROWS else None
    blamed = set(view["blamed"])
    shown = [r for r in ranks if usual is None or (r.comm, r.op, r.seq, r.state) != usual or r.rank in blamed]
    island_names = view["strings"]["island"]
    island_col = view["ranks"]["island"]
    out = ['<table class="ranks"><tr><th>rank</th><th>host</th><th>island</th><th>comm</th><th>op</th>'
           '<th>seq</th><th>state</th><th>waiting on</th></tr>']
    for r in shown[:MAX_RANK_ROWS]:
        isl = island_col[r.rank] if 0 <= r.rank < len(island_col) else -1
        out.append(f'<tr class="{"blamed" if r.rank in blamed else ""}"><td>{r.rank}</td><td>{_e(r.host)}</td>'
                   f'<td>{_e(island_names[isl] if isl >= 0 else None)}</td><td>{_e(r.comm)}</td>'
                   f'<td>{_e(r.op)}</td><td>{_e(r.seq)}</td><td>{_e(r.state)}</td>'
                   f'<td>{_e(", ".join(str(x) for x in r.waiting_on) or None)}</td></tr>')
    out.append("</table>")
    if usual is not None:
        comm, op, seq, state = usual
        rest = len(shown) - min(len(shown), MAX_RANK_ROWS)
        out.append(f"<p>… {common[usual]} other rank(s): {_e(state)} in {_e(op)} seq {_e(seq)} on comm {_e(comm)}"
                   + (f" ({rest} more unusual not shown; see <code>--json</code>)" if rest else "") + "</p>")
    return "".join(out)


def render_html(report: Report, job: Optional[LoadedJob] = None) -> str:
    """The incident page for `report`; `job` (what the engine loaded) adds the pictures' detail."""
    view = build_view(report, job)
    status = report.status.value
    head = (f"job {_e(report.job)}" + (f", incident {_e(report.incident)}" if report.incident else "")
            + f" ({_e(report.source)}, {_e(report.world_size or '?')} ranks)")
    verdicts = "".join(_verdict(i, v) for i, v in enumerate(report.verdicts, 1)) or "<p>no verdicts</p>"
    problems = "".join(f"<li><code>{_e(p.path)}</code>: {_e(p.problem)}</li>"
                       for p in report.data_problems[:_MAX_PROBLEMS])
    if len(report.data_problems) > _MAX_PROBLEMS:
        problems += f"<li>… and {len(report.data_problems) - _MAX_PROBLEMS} more (see --json)</li>"
    notes = "".join(f"<li>{_e(n)}</li>" for n in report.notes)
    exclude = " ".join(_e(h) for h in report.exclude_hosts)
    csp = (f"default-src 'none'; img-src data:; style-src '{_csp_hash(STYLE)}'; "
           f"script-src '{_csp_hash(SCRIPT)}'; base-uri 'none'; form-action 'none'")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hetobs incident: job {_e(report.job)} {_e(status)}</title>
<style>{STYLE}</style></head>
<body data-status="{_e(status)}">
<header><h1>hetobs incident report</h1>
<p class="head">{head}: <span class="status {_e(status)}" id="status">{_e(status.upper())}</span></p>
{f'<p>exclude hosts: <code>{exclude}</code></p>' if exclude else ''}</header>
<noscript><p>The pictures need JavaScript; the verdicts and tables do not.</p></noscript>
<section id="verdicts"><h2>Verdicts</h2>{verdicts}</section>
<section><h2>Ring and rank states</h2>
<p class="hint">One mark per rank, in the ring order of the communicator the verdicts name; red marks are blamed.
Click a rank (or the ring) to zoom into it and its neighbours.</p>
<div class="row"><div id="ring"></div><div><div id="legend"></div><p id="ring-hover" class="small"></p></div></div>
<h3>Zoom</h3><div id="zoom"></div></section>
<section><h2>Timeline</h2>
<p class="hint">The last ops of the blamed ranks and their ring neighbours, up to the incident: green completed,
blue or red still running at the incident, a black tick where a rank arrived at the incident's op.</p>
<div id="timeline"></div><h3>Arrivals, every rank</h3><div id="arrivals"></div></section>
<section><h2>Per-link bandwidth</h2><div id="bandwidth"></div></section>
<section><h2>Ranks</h2>{_rank_rows(report.ranks, view)}</section>
{f'<section><h2>Data problems</h2><ul>{problems}</ul></section>' if problems else ''}
{f'<section><h2>Notes</h2><ul>{notes}</ul></section>' if notes else ''}
<script type="application/json" id="hetobs-data">{_json_for_script(view)}</script>
<script>{SCRIPT}</script>
</body></html>
"""
