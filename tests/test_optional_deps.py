"""What a user sees when a module hetobs needs is missing (issue 10 item 9).

prometheus-client is a core dependency (`pip install hetobs` then `hetobs exporter`
works); OpenTelemetry stays an extra, and its absence names the extra to install; "is
hetobs built?" only when the native module is missing. Each case runs the real CLI in a
subprocess whose import system hides one module (a meta-path blocker), as an install
without it would be.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BLOCKER = """
import sys
from importlib.abc import MetaPathFinder

class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {hidden!r} or name.startswith({hidden!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

for mod in [m for m in sys.modules if m == {hidden!r} or m.startswith({hidden!r} + ".")]:
    del sys.modules[mod]
sys.meta_path.insert(0, Hide())
"""


def _cli_without(hidden: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = BLOCKER.format(hidden=hidden) + f"from hetobs.cli.main import main\nmain({list(args)!r})\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_prometheus_client_is_a_core_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("prometheus-client") for d in project["dependencies"])
    assert not any(d.startswith("prometheus-client") for d in project["optional-dependencies"]["telemetry"])


def test_missing_dependency_is_not_called_an_unbuilt_hetobs(tmp_path: Path) -> None:
    r = _cli_without("prometheus_client", "exporter", "--job", "nojob-deps", "--dir", str(tmp_path),
                     "--textfile", str(tmp_path / "x.prom"))
    assert r.returncode == 4, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "No module named 'prometheus_client'" in line and "is hetobs built" not in line, r.stderr
    assert "pip install hetobs" in line and "Traceback" not in r.stderr


def test_missing_opentelemetry_names_the_extra(tmp_path: Path) -> None:
    r = _cli_without("opentelemetry", "exporter", "--job", "nojob-deps", "--dir", str(tmp_path), "--port", "0",
                     "--otlp-endpoint", "http://127.0.0.1:9")
    assert r.returncode == 4, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "No module named 'opentelemetry" in line and "pip install 'hetobs[telemetry]'" in line, r.stderr
    assert "is hetobs built" not in line and "Traceback" not in r.stderr


def test_missing_native_module_asks_whether_hetobs_is_built() -> None:
    code = BLOCKER.format(hidden="hetobs._core") + (
        "from hetobs.cli import _errors\n"
        "try:\n    import hetobs._core\nexcept ImportError as e:\n    raise SystemExit(int(_errors.report(e)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 4 and "No module named 'hetobs._core'" in r.stderr, r.stderr
    assert "is hetobs built? run: bash scripts/setup.sh" in r.stderr
