"""One settings table (hetobs/settings_table.py) for Python, the native core and the README.

- the native table (generated from the Python one at build time) equals it row by row,
  defaults and choices included: a stale build fails here;
- both parsers read every setting alike: the same value, or the same error naming the
  variable and the value, for good and bad input of every kind;
- the README's table is exactly the one rendered from it;
- nothing reads a HETOBS_* variable around it (Python or C++, the interposers included).
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from hetobs.config import SETTINGS, SettingError, setting, spec
from hetobs.settings_table import FLAG_CHOICES, KINDS

ROOT = Path(__file__).resolve().parents[1]


def _script() -> Any:
    loaded = importlib.util.spec_from_file_location("settings_table_script", ROOT / "scripts" / "settings_table.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


# -- the table itself ------------------------------------------------------------------------

def test_rows_are_well_formed() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names)), "a setting is listed twice"
    for s in SETTINGS:
        assert re.fullmatch(r"HETOBS_[A-Z0-9_]+", s.name), s.name
        assert s.kind in KINDS, s
        assert s.doc.strip() and "\n" not in s.doc, f"{s.name}: one line of doc"
        if s.kind in ("float", "int"):
            assert s.minimum is not None, s.name
        if s.kind == "int":
            assert s.maximum is not None and s.maximum >= s.minimum, s.name
        if s.kind == "choice":
            assert s.choices and s.default.strip().lower() in s.choices, s.name
        if s.kind == "flag":
            assert s.choices == FLAG_CHOICES and s.default in FLAG_CHOICES, s.name
        assert s.kind in ("choice", "flag") or not s.choices, s.name
        setting(s.name, {})  # every default is a value its own reader takes


def test_the_default_is_what_an_unset_variable_reads() -> None:
    assert setting("HETOBS_TIMEOUT", {}) == 600.0 and setting("HETOBS_RECORDS", {}) == 2048
    assert setting("HETOBS_TRANSPORT", {}) == "auto" and setting("HETOBS_WATCHDOG", {}) is True
    assert setting("HETOBS_DUMP_SIGNAL", {}) == 0 and setting("HETOBS_SECRET", {}) == ""
    assert setting("HETOBS_RELAY_STAGE", {}) == "auto" and setting("HETOBS_RELAY_PIPELINE", {}) == "1"


def test_bad_values_name_the_variable_and_the_value() -> None:
    with pytest.raises(SettingError, match=r"^HETOBS_RELAY_STAGE='gpu': expected one of auto, host, device$"):
        setting("HETOBS_RELAY_STAGE", {"HETOBS_RELAY_STAGE": "gpu"})
    with pytest.raises(SettingError, match=r"^HETOBS_RELAY_SLOTS='0': must be at least 1$"):
        setting("HETOBS_RELAY_SLOTS", {"HETOBS_RELAY_SLOTS": "0"})
    with pytest.raises(SettingError, match=r"^HETOBS_TORCH_NATIVE='yes': expected one of 0, 1, true, false$"):
        setting("HETOBS_TORCH_NATIVE", {"HETOBS_TORCH_NATIVE": "yes"})
    with pytest.raises(KeyError):
        spec("HETOBS_NO_SUCH_SETTING")


def test_relay_settings_are_read_through_the_table() -> None:
    from hetobs.islands.relay import relay_pipelined, relay_stage

    assert relay_stage({"HETOBS_RELAY_STAGE": " Host "}) == "host"
    assert relay_pipelined({"HETOBS_RELAY_PIPELINE": "0"}) is False and relay_pipelined({}) is True
    with pytest.raises(SettingError, match="HETOBS_RELAY_PIPELINE='2'"):
        relay_pipelined({"HETOBS_RELAY_PIPELINE": "2"})


def test_an_island_rank_with_a_bad_relay_setting_fails_at_the_exchange() -> None:
    # Checked before the identity is published, so every rank hears of it (islands/topology.py).
    from hetobs.islands.topology import IslandError, local_identity

    with pytest.raises(IslandError, match=r"^HETOBS_RELAY_STAGE='gpu': expected one of auto, host, device \(rank 3\)$"):
        local_identity({"HETOBS_ISLAND_DEVICE": "cpu", "HETOBS_RELAY_STAGE": "gpu"}, rank=3)


# -- the native table --------------------------------------------------------------------------

def test_native_table_equals_the_python_table_row_by_row(core: Any) -> None:
    native = list(core.settings_table())
    assert [row[0] for row in native] == [s.name for s in SETTINGS], "rows differ in names or order: rebuild"
    for row, s in zip(native, SETTINGS):
        name, kind, default, minimum, maximum, choices = row
        python = (s.name, s.kind, s.default, float(s.minimum or 0.0), int(s.maximum or 0), tuple(s.choices))
        assert (name, kind, default, minimum, maximum, tuple(choices)) == python, s.name


def _as_text(value: Any) -> str:
    """A value of `setting` as the native readSetting writes it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return "inf" if math.isinf(value) and value > 0 else "%.17g" % value
    return str(value)


# Good and bad input of every kind (no value holds a quote: repr() and the native message
# would quote it differently, which says nothing about the parsers).
_SAMPLES = {
    "float": ["1", " 2.5 ", "0.5", "1e3", "1_000", "inf", "Infinity", "nan", "-1", "-inf", "abc", "", "0x10",
              "0.0001", "1e999"],
    "int": ["1", " 7 ", "+5", "1_0", "0", "-1", "1.5", "abc", "", "inf", "99999999999999999999999",
            "-99999999999999999999999", "1073741825", "4611686018427387905"],
    "choice": ["", "bogus", " x "],
    "flag": ["0", "1", "TRUE", " false ", "yes", ""],
    "signal": ["off", "", "0", "none", "SIGUSR2", "usr1", "10", "9", "KILL", "SIGSTOP", "bogus", "99999999"],
    "text": ["x", " y ", ""],
}


def _samples(s: Any) -> list[str]:
    extra = [c for c in s.choices] + [c.upper() for c in s.choices] if s.kind == "choice" else []
    return _SAMPLES[s.kind] + extra


@pytest.mark.parametrize("name", [s.name for s in SETTINGS])
def test_both_parsers_read_every_setting_alike(core: Any, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    row = spec(name)
    monkeypatch.delenv(name, raising=False)
    cases: list[str | None] = [None, *_samples(row)]
    for raw in cases:
        if raw is None:
            monkeypatch.delenv(name, raising=False)
            env: dict[str, str] = {}
        else:
            monkeypatch.setenv(name, raw)
            env = {name: raw}
        try:
            python: tuple[str, str] = ("value", _as_text(setting(name, env)))
        except SettingError as e:
            python = ("error", str(e))
        try:
            native: tuple[str, str] = ("value", core.native_setting(name))
        except ValueError as e:
            native = ("error", str(e))
        assert native == python, f"{name}={raw!r}"


def test_native_reader_refuses_a_name_outside_the_table(core: Any) -> None:
    with pytest.raises(ValueError, match="HETOBS_NO_SUCH_SETTING: not in the settings table"):
        core.native_setting("HETOBS_NO_SUCH_SETTING")


def test_interposers_resolve_the_socket_interface_through_the_one_parser(core: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETOBS_SOCKET_IFNAME", "lo")
    assert core.advertised_address() == "127.0.0.1"
    monkeypatch.setenv("HETOBS_SOCKET_IFNAME", " =lo ")  # stripped, as for the transport's listeners
    assert core.advertised_address() == "127.0.0.1"
    monkeypatch.setenv("HETOBS_SOCKET_IFNAME", "=nosuchif9")
    with pytest.raises(Exception, match="HETOBS_SOCKET_IFNAME='=nosuchif9': no IPv4 interface"):
        core.advertised_address()
    monkeypatch.delenv("HETOBS_SOCKET_IFNAME")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert core.advertised_address() == "127.0.0.1"  # the route toward MASTER_ADDR
    monkeypatch.delenv("MASTER_ADDR")
    assert core.advertised_address() not in ("", "0.0.0.0")  # never the wildcard: peers dial it


# -- the README ----------------------------------------------------------------------------------

def test_readme_table_is_the_rendered_table() -> None:
    script = _script()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert script.readme_table(readme) == script.render(), \
        "README settings table drifted: run python scripts/settings_table.py --write"


def test_rendered_table_shows_every_row_with_its_values() -> None:
    script = _script()
    lines = script.render().splitlines()
    assert lines[0] == "| Variable | Default | Values | Meaning |"
    body = lines[2:]
    assert [line.split("`")[1] for line in body] == [s.name for s in SETTINGS]
    by_name = dict(zip((s.name for s in SETTINGS), body))
    assert "| integer 1..1073741824 |" in by_name["HETOBS_RECORDS"]
    assert "| number >= 0.001, or inf |" in by_name["HETOBS_TIMEOUT"]
    assert "| auto, shm, tcp |" in by_name["HETOBS_TRANSPORT"]
    assert "| `<tmp>/hetobs-<uid>` |" in by_name["HETOBS_DIR"]


# -- nothing reads around the table ------------------------------------------------------------------

# HETOBS_DEMO_*: the demo runner's instructions to the ranks it starts (hetobs/demo/rank.py), not
# settings (the README says so).
_NOT_SETTINGS = re.compile(r"HETOBS_DEMO_[A-Z_]+")
# A read: env.get("HETOBS_X"), environ.setdefault(...), or env["HETOBS_X"] that is not assigned to
# (a launcher composing a child's environment writes, which is no read).
_PY_READ = re.compile(r"""(?:environ|env)\s*(?:(?:\.get|\.setdefault)\(\s*["'](HETOBS_[A-Z0-9_]+)["']"""
                      r"""|\[\s*["'](HETOBS_[A-Z0-9_]+)["']\s*\](?!\s*=[^=]))""")
_CC_READ = re.compile(r"""getenv\(\s*"(HETOBS_[A-Z0-9_]+)\"""")
# The two readers themselves (and the table).
_READERS = {Path("hetobs/config.py"), Path("hetobs/settings_table.py"), Path("csrc/src/common/env_config.cc")}


def _direct_reads() -> list[str]:
    found = []
    for folder, pattern, suffixes in (("hetobs", _PY_READ, (".py",)), ("cli", _PY_READ, (".py",)),
                                      ("exporters", _PY_READ, (".py",)),
                                      ("csrc", _CC_READ, (".cc", ".h", ".cpp"))):
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT)
            if path.suffix not in suffixes or rel in _READERS or "tests" in rel.parts:
                continue
            for m in pattern.finditer(path.read_text(encoding="utf-8", errors="replace")):
                name = next(g for g in m.groups() if g)
                if not _NOT_SETTINGS.fullmatch(name):
                    found.append(f"{rel}: {m.group(0)}")
    return found


def test_every_read_goes_through_the_table() -> None:
    assert _direct_reads() == [], "read these through hetobs.config.setting / env_config.h instead"


def test_the_scan_sees_a_direct_read() -> None:
    # The scan above must be able to fail: its patterns match the ways a read is written.
    for text in ('os.environ.get("HETOBS_TIMEOUT", "1")', "x = env['HETOBS_DIR']", 'environ.setdefault("HETOBS_X", "")',
                 'if env["HETOBS_DIR"] == root:'):
        assert _PY_READ.search(text), text
    assert _CC_READ.search('const char* v = getenv("HETOBS_SOCKET_IFNAME");')
    assert not _PY_READ.search('env["HETOBS_DIR"] = root'), "a write is no read"


def test_table_file_loads_without_hetobs() -> None:
    # The build generates the C++ table from it before hetobs is importable.
    import subprocess

    code = ("import importlib.util, sys; sys.modules['hetobs'] = None\n"
            "s = importlib.util.spec_from_file_location('t', sys.argv[1]); m = importlib.util.module_from_spec(s)\n"
            "sys.modules['t'] = m; s.loader.exec_module(m); print(len(m.SETTINGS))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "hetobs" / "settings_table.py")],
                         capture_output=True, text=True, check=True).stdout
    assert int(out) == len(SETTINGS)
