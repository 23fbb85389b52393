"""monitoring/: the Grafana dashboard and the Prometheus rules use only metrics the exporter serves.

`promtool check rules` and `promtool test rules` (Debian's prometheus package) must
pass; without promtool those two are skipped with that reason. That every dashboard
query is valid PromQL is checked against a real Prometheus in
test_exporter_prometheus.py, which also loads alerts.yml and sees the hang alert go
off for a stopped rank.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hetobs.exporters.naming import METRICS, served_names

MONITORING = Path(__file__).resolve().parents[1] / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian's prometheus "
                                    "package; scripts/setup.sh installs it)")
NAME = re.compile(r"(?<![A-Za-z0-9_:])(hetobs[_:][A-Za-z0-9_:]*)")
PROMETHEUS_OWN = {"up"}  # synthesised by Prometheus per target, used by HetobsExporterDown


def rule_exprs() -> tuple[list[str], set[str]]:
    """(every expr, the names recorded by recording rules) of alerts.yml, without a YAML library."""
    text = (MONITORING / "alerts.yml").read_text()
    exprs, recorded = [], set()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^(\s*)(?:- )?(record|expr):\s*(.*)$", line)
        if m and m.group(2) == "record":
            recorded.add(m.group(3).strip())
        elif m and m.group(2) == "expr":
            value = m.group(3).strip()
            if value in ("|", ">"):
                indent = len(m.group(1))
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                exprs.append(" ".join(block))
                continue
            exprs.append(value)
        i += 1
    return exprs, recorded


def dashboard_exprs() -> list[str]:
    doc = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in doc["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def test_rules_and_dashboard_name_only_served_metrics() -> None:
    rules, recorded = rule_exprs()
    dash = dashboard_exprs()
    assert len(rules) >= 8 and len(dash) >= 15
    served = served_names()
    for expr in rules + dash:
        names = set(NAME.findall(expr))
        assert names or expr.startswith("up{"), f"no hetobs metric in {expr!r}"
        unknown = names - served - recorded
        assert not unknown, f"{expr!r} names metrics the exporter does not serve: {sorted(unknown)}"
        bare = set(re.findall(r"(?<![A-Za-z0-9_:$])([a-z][a-z0-9_]*)\{", expr)) - served - PROMETHEUS_OWN
        assert not bare, f"{expr!r}: unknown metric {sorted(bare)}"
    # The fixed names other tools rely on are served and used.
    assert {"hetobs_collective_bytes_total", "hetobs_seconds_since_progress"} <= served
    assert any("hetobs_seconds_since_progress" in e for e in rules)
    assert all(m.name.startswith("hetobs_") for m in METRICS)


@needs_promtool
def test_promtool_check_rules() -> None:
    r = subprocess.run([PROMTOOL, "check", "rules", str(MONITORING / "alerts.yml")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
def test_promtool_rule_unit_tests() -> None:
    r = subprocess.run([PROMTOOL, "test", "rules", str(MONITORING / "alerts_test.yml")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_monitoring_readme_lists_every_metric() -> None:
    """monitoring/README.md's table equals naming.METRICS (name, type, labels), in order."""
    text = (MONITORING / "README.md").read_text()
    rows = re.findall(r"^\| `(hetobs_[a-z_]+)` \| (\w+) \| ([a-z_, ]+) \|", text, flags=re.M)
    want = [(m.name + ("_total" if m.kind == "counter" else ""), m.kind, ", ".join(m.labels)) for m in METRICS]
    assert rows == want, "monitoring/README.md's metric table drifted from exporters/naming.py"
