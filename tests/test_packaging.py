"""Packaging: the wheel nests cli/ and exporters/ inside hetobs, and `import hetobs` stays light.

The editable install hides packaging mistakes (its finder also puts the repo root on
sys.path, so a stray `import cli` works there and breaks from a wheel), hence one
real wheel build, inspected and imported in isolation. It reuses the project's
build/<wheel tag> directory, so after scripts/setup.sh it is an incremental build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    wheels = list(out.glob("hetobs-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_wheel_layout(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "hetobs/cli/main.py" in names
    assert "hetobs/cli/__init__.py" in names
    assert "hetobs/exporters/__init__.py" in names
    assert any(re.fullmatch(r"hetobs/_core\.[^/]*\.so", n) for n in names), "no hetobs/_core*.so in the wheel"
    # Built with the venv's torch (--no-build-isolation): the C++ torch wrapper is in.
    assert any(re.fullmatch(r"hetobs/_torch_ext\.[^/]*\.so", n) for n in names), "no hetobs/_torch_ext*.so"
    assert not [n for n in names if n.startswith(("cli/", "exporters/"))], "top-level cli/ or exporters/ in the wheel"
    top = {n.split("/", 1)[0] for n in names}
    strays = {t for t in top if t != "hetobs" and not t.endswith((".dist-info", ".data"))}
    assert not strays, f"unexpected top-level entries: {sorted(strays)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert re.search(r"^hetobs\s*=\s*hetobs\.cli\.main:main\s*$", text, flags=re.M), text


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_wheel_imports_in_isolation(wheel: Path, tmp_path: Path) -> None:
    """Run `hetobs version --json` from the unpacked wheel alone, with no editable finder."""
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    import typer  # the dependencies come from the venv's site-packages, without its .pth files

    deps = Path(typer.__file__).resolve().parents[1]
    code = (
        "import sys, hetobs, hetobs.cli.main as m;"
        f"assert hetobs.__file__.startswith({str(unpacked)!r}), hetobs.__file__;"
        "assert 'cli' not in sys.modules and 'exporters' not in sys.modules;"
        "m.main(['version', '--json'])"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(unpacked), str(deps)])}
    proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["core"]["path"].startswith(str(unpacked))


def test_import_hetobs_does_not_import_torch() -> None:
    code = "import hetobs, sys; assert 'torch' not in sys.modules, 'import hetobs imported torch'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


_BANNED = re.compile(r"^\s*(?:from|import)\s+(?:cli|exporters)\b", re.M)


@pytest.mark.parametrize("package", ["cli", "exporters"])
def test_no_top_level_cli_or_exporters_imports(package: str) -> None:
    """Inside cli/ and exporters/ only `hetobs.…` or relative imports work once installed."""
    bad = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}"
           for p in sorted((ROOT / package).rglob("*.py"))
           for m in _BANNED.finditer(p.read_text(encoding="utf-8"))]
    assert not bad, bad
