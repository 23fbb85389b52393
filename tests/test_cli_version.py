"""`hetobs version`: human and --json output, a core that fails to load, unknown commands.

Runs in-process with typer's CliRunner, which keeps stdout and stderr apart, so the
tests also pin the rule that --json stdout is one JSON document and nothing else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hetobs
from hetobs.cli.main import app

runner = CliRunner()


def test_version_human() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0, result.output
    assert hetobs.__version__ in result.stdout
    assert "core" in result.stdout
    assert result.stderr == ""


def test_version_json() -> None:
    result = runner.invoke(app, ["version", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["hetobs"] == hetobs.__version__
    assert "core_error" not in data
    core = data["core"]
    assert core is not None
    assert core["version"] == hetobs.__version__  # the native core says which build it is
    assert core["path"] and "_core" in core["path"] and Path(core["path"]).is_file()
    build = core["build"]
    assert build["version"] == hetobs.__version__ and build["record_bytes"] > 0 and build["compiler"], build
    assert result.stderr == ""


def test_version_reports_a_stale_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """A native core of another version (a stale build) is a problem: exit 4, both versions named."""
    import hetobs._core

    monkeypatch.setattr(hetobs._core, "__version__", "0.0.0-stale")
    result = runner.invoke(app, ["version", "--json"])
    assert result.exit_code == 4, result.output
    assert json.loads(result.stdout)["core"]["version"] == "0.0.0-stale"
    assert "0.0.0-stale" in result.stderr and hetobs.__version__ in result.stderr, result.stderr


def test_version_reports_a_core_that_fails_to_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hetobs._core", None)  # makes `import hetobs._core` raise
    result = runner.invoke(app, ["version", "--json"])
    assert result.exit_code == 4, result.output
    data = json.loads(result.stdout)  # still one parseable document on stdout
    assert data["core"] is None
    assert "hetobs._core" in data["core_error"]
    assert "hetobs._core" in result.stderr and "error" in result.stderr


def test_version_does_not_import_torch() -> None:
    # version reads torch's version from package metadata only.
    before = "torch" in sys.modules
    runner.invoke(app, ["version", "--json"])
    assert ("torch" in sys.modules) == before


def test_unknown_command_exits_2() -> None:
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2
    assert "no-such-command" in result.stderr


def test_unknown_option_exits_2() -> None:
    result = runner.invoke(app, ["version", "--no-such-option"])
    assert result.exit_code == 2


def test_no_arguments_shows_help() -> None:
    result = runner.invoke(app, [])
    assert result.exit_code in (0, 2)  # click >= 8.2 exits 2 for no_args_is_help
    assert "version" in result.output
