"""Packaging: the wheel that pip builds carries the C++ torch wrapper, nests cli/ and exporters/
inside hetobs, and `import hetobs` stays light.

The editable install hides packaging mistakes (its finder also puts the repo root on
sys.path, so a stray `import cli` works there and breaks from a wheel; its build sees the
venv's torch, which an isolated build does not), hence one real wheel built as `pip wheel .`
builds it: in an isolated environment holding only the build requirements, torch among
them. That torch is this disk's CPU wheel, pinned (on PyPI, torch==2.13.0 for Linux is a
CUDA build of several GB); the test checks that the build environment took it. The wheel is
then inspected, imported alone, and installed into a fresh venv with torch, where
"hetobs_gloo" must run through hetobs._torch_ext.
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

from hetobs.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
TORCH = "2.13.0"  # pyproject.toml's build requirement


def local_torch_wheel() -> Path | None:
    """This disk's CPU wheel of torch TORCH for this Python, in pip's find-links (as scripts/setup.sh finds it)."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for d in [*os.environ.get("PIP_FIND_LINKS", "").split(), "/opt/wheels"]:
        found = sorted(Path(d).glob(f"torch-{TORCH}+cpu-{tag}-{tag}-*.whl")) if Path(d).is_dir() else []
        if found:
            return found[0]
    return None


def pinned_pip_env(torch_wheel: Path, tmp: Path) -> dict[str, str]:
    """pip (and the pip that fills an isolated build environment) takes torch from `torch_wheel` only."""
    constraints = tmp / "constraints.txt"
    constraints.write_text(f"torch=={TORCH}+cpu\n")
    # PIP_BUILD_CONSTRAINT: where pip no longer applies PIP_CONSTRAINT to build environments.
    return {**os.environ, "PIP_FIND_LINKS": str(torch_wheel.parent), "PIP_CONSTRAINT": str(constraints),
            "PIP_BUILD_CONSTRAINT": str(constraints)}


class PipWheel:
    def __init__(self, path: Path, log: str, torch_wheel: Path, env: dict[str, str]) -> None:
        self.path, self.log, self.torch_wheel, self.env = path, log, torch_wheel, env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> PipWheel:
    torch_wheel = local_torch_wheel()
    if torch_wheel is None:
        pytest.skip(f"no CPU wheel of torch {TORCH} in PIP_FIND_LINKS or /opt/wheels: an isolated build would "
                    "download torch from the index (on PyPI a CUDA build of several GB)")
    tmp = tmp_path_factory.mktemp("wheel")
    out = tmp / "dist"
    env = pinned_pip_env(torch_wheel, tmp)
    # The build directory of its own: build/<wheel tag> is the editable install's, configured
    # against the venv's torch, and an isolated build's torch is gone once it ends.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-v", "-w", str(out),
         f"--config-settings=build-dir={tmp / 'build'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"pip wheel failed:\n{log[-6000:]}"
    wheels = list(out.glob("hetobs-*.whl"))
    assert len(wheels) == 1, wheels
    return PipWheel(wheels[0], log, torch_wheel, env)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_isolated_build_took_the_local_cpu_torch(wheel: PipWheel) -> None:
    installed = re.findall(r"Successfully installed (.*)", wheel.log)
    assert installed, "no build requirements were installed: was the build isolated?"
    assert f"torch-{TORCH}+cpu" in installed[0].split(), installed[0]
    assert f"Processing {wheel.torch_wheel}" in wheel.log  # from this disk, not downloaded
    fetched = re.findall(r"(?:Downloading|Collecting) (\S+)", wheel.log)
    assert not [f for f in fetched if re.match(r"(torch|nvidia|triton)\b", f, re.I)], fetched
    assert "building hetobs._torch_ext against torch" in wheel.log


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_wheel_layout(wheel: PipWheel) -> None:
    names = zipfile.ZipFile(wheel.path).namelist()
    assert "hetobs/cli/main.py" in names
    assert "hetobs/cli/__init__.py" in names
    assert "hetobs/exporters/__init__.py" in names
    assert any(re.fullmatch(r"hetobs/_core\.[^/]*\.so", n) for n in names), "no hetobs/_core*.so in the wheel"
    # torch is a build requirement: the C++ torch wrapper is in.
    assert any(re.fullmatch(r"hetobs/_torch_ext\.[^/]*\.so", n) for n in names), "no hetobs/_torch_ext*.so"
    assert not [n for n in names if n.startswith(("cli/", "exporters/"))], "top-level cli/ or exporters/ in the wheel"
    top = {n.split("/", 1)[0] for n in names}
    strays = {t for t in top if t != "hetobs" and not t.endswith((".dist-info", ".data"))}
    assert not strays, f"unexpected top-level entries: {sorted(strays)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel.path).read(entry_points).decode()
    assert re.search(r"^hetobs\s*=\s*hetobs\.cli\.main:main\s*$", text, flags=re.M), text


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_wheel_imports_in_isolation(wheel: PipWheel, tmp_path: Path) -> None:
    """Run `hetobs version --json` from the unpacked wheel alone, with no editable finder."""
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel.path).extractall(unpacked)
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


FRESH_VENV_PROGRAM = """
import json, os, sys, torch, torch.distributed as dist
import hetobs, hetobs.torch
from hetobs import _torch_ext
dist.init_process_group("hetobs_gloo")
x = torch.ones(4)
dist.all_reduce(x)
dist.barrier()
print("OUT " + json.dumps({
    "hetobs": hetobs.__file__, "torch_ext": _torch_ext.__file__, "built_for": _torch_ext.TORCH_VERSION,
    "torch": torch.__version__, "in_use": hetobs.torch.native_wrapper() is _torch_ext,
    "backend": dist.group.WORLD._get_backend(torch.device("cpu")).name(), "x": x.tolist(),
    "records": [(r["op"], r["state"]) for r in hetobs.records()]}), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_wheel_in_a_fresh_venv_with_torch_runs_the_cpp_wrapper(wheel: PipWheel, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel.torch_wheel), str(wheel.path)],
                          env=wheel.env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETOBS_", "PYTHON"))}
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               HETOBS_DIR=str(tmp_path / "jobs"), GLOO_SOCKET_IFNAME="lo")
    run = subprocess.run([str(py), "-c", FRESH_VENV_PROGRAM], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("OUT "))[4:])
    assert out["hetobs"].startswith(str(venv)) and out["torch_ext"].startswith(str(venv)), out
    assert out["built_for"] == out["torch"] == f"{TORCH}+cpu"
    assert out["in_use"] and out["backend"] == "hetobs_gloo", out  # the C++ c10d backend, not the fallback
    assert "hetobs._torch_ext is not available" not in run.stderr
    assert out["x"] == [1.0] * 4
    assert out["records"] == [["all_reduce", "completed"], ["barrier", "completed"]]


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
