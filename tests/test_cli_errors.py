"""`hetobs.cli.main.main()` turns escaping exceptions into one stderr line and an exit code.

Also the Output sink's contract: data on stdout (plain JSON in --json mode), messages
on stderr. And the real console script end to end in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

from hetobs.cli import _errors
from hetobs.cli import main as cli_main
from hetobs.cli._exit_codes import ExitCode
from hetobs.cli._output import Output
from hetobs.config import SettingError
from hetobs.errors import PeerError


def _run_main_raising(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> int:
    def boom(*args: object, **kwargs: object) -> NoReturn:
        raise exc

    monkeypatch.setattr(cli_main, "app", boom)
    with pytest.raises(SystemExit) as info:
        cli_main.main([])
    code = info.value.code
    assert isinstance(code, int)
    return code


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (SettingError("HETOBS_TIMEOUT='x': expected a number"), ExitCode.USAGE),
        (ValueError("RANK=5, WORLD_SIZE=4: need 0 <= RANK < WORLD_SIZE"), ExitCode.USAGE),
        (FileNotFoundError(2, "No such file or directory", "/nope"), ExitCode.INTERNAL),
        (PeerError("rank 3 closed the connection during all_reduce seq 7"), ExitCode.INTERNAL),
    ],
)
def test_known_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                   exc: Exception, code: ExitCode) -> None:
    monkeypatch.delenv(_errors.TRACEBACK_ENV, raising=False)
    assert _run_main_raising(monkeypatch, exc) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err


def test_setting_error_names_the_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from hetobs.config import from_env

    try:
        from_env({"HETOBS_TIMEOUT": "soon"})
    except SettingError as exc:
        assert _run_main_raising(monkeypatch, exc) == ExitCode.USAGE
    else:
        pytest.fail("HETOBS_TIMEOUT=soon was accepted")
    assert "HETOBS_TIMEOUT" in capsys.readouterr().err


def test_traceback_on_request(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(_errors.TRACEBACK_ENV, "1")
    assert _run_main_raising(monkeypatch, OSError("disk on fire")) == ExitCode.INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith("OSError: disk on fire")


def test_unknown_error_is_internal_with_traceback(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(_errors.TRACEBACK_ENV, raising=False)
    assert _run_main_raising(monkeypatch, RuntimeError("bug")) == ExitCode.INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error: RuntimeError: bug" in err


def test_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run_main_raising(monkeypatch, KeyboardInterrupt()) == ExitCode.INTERRUPTED


def test_exit_codes_are_stable() -> None:
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0, "FAULT": 1, "USAGE": 2, "NO_DATA": 3, "INTERNAL": 4, "INTERRUPTED": 130}


def test_output_json_mode_is_plain(capsys: pytest.CaptureFixture[str]) -> None:
    out = Output(json_mode=True)
    out.table([{"op": "all_reduce", "busbw": 1.5, "note": "[bold]x[/bold]"}])
    out.table([])
    out.warning("slow link")
    captured = capsys.readouterr()
    first, second = captured.out.splitlines()
    assert json.loads(first) == [{"op": "all_reduce", "busbw": 1.5, "note": "[bold]x[/bold]"}]
    assert json.loads(second) == []
    assert "\x1b" not in captured.out
    assert captured.err.strip() == "warning: slow link"


def test_output_human_mode(capsys: pytest.CaptureFixture[str]) -> None:
    out = Output()
    out.table([{"op": "all_reduce", "note": "[rank 3]"}], title="bandwidth")
    out.error("boom")
    captured = capsys.readouterr()
    assert "all_reduce" in captured.out and "[rank 3]" in captured.out  # no markup eaten
    assert captured.err.strip() == "error: boom"


def test_console_script_end_to_end() -> None:
    """The installed entry point, as a user runs it: JSON only on stdout, exit code kept."""
    script = Path(sys.executable).with_name("hetobs")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hetobs.cli"]
    proc = subprocess.run([*cmd, "version", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["hetobs"]
    bad = subprocess.run([*cmd, "no-such-command"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""


def _console() -> list[str]:
    script = Path(sys.executable).with_name("hetobs")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hetobs.cli"]


@pytest.mark.parametrize("argv", [
    ["diagnose", "--job", "../../etc"],
    ["diagnose"],
    ["diagnose", "--job", "j", "--fr", "/tmp"],
    ["diagnose", "--no-such-option"],
    ["dump"],
    ["top", "--interval", "soon"],
    ["version", "--bogus"],
    ["bench", "--no-such-option"],
    ["no-such-command"],
])
def test_usage_errors_are_one_line_on_stderr(argv: list[str], tmp_path: Path) -> None:
    """The README: a usage error is one line on stderr and exit 2 (not click's boxed usage text)."""
    proc = subprocess.run([*_console(), *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "HETOBS_DIR": str(tmp_path), "COLUMNS": "80"})
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "╭" not in proc.stderr and "Traceback" not in proc.stderr


def test_exit_codes_survive_non_standalone_mode(tmp_path: Path) -> None:
    """Commands that end with typer.Exit(code) keep their code; --help still prints and exits 0."""
    env = {**os.environ, "HETOBS_DIR": str(tmp_path)}
    missing = subprocess.run([*_console(), "diagnose", "--job", "nope", "--json"], capture_output=True, text=True,
                             timeout=120, env=env)
    assert missing.returncode == ExitCode.NO_DATA, missing.stderr
    assert json.loads(missing.stdout)["status"] == "no_data"
    helped = subprocess.run([*_console(), "diagnose", "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert helped.returncode == 0 and "--job" in helped.stdout and helped.stderr == ""
