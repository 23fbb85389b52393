"""Render the README's settings table from hetobs/settings_table.py (the one source).

    .venv/bin/python scripts/settings_table.py           # print the table
    .venv/bin/python scripts/settings_table.py --write   # put it into README.md under "## Settings"

tests/test_settings_table.py checks that README.md holds exactly what this renders.
The table file is loaded by path, so this runs before hetobs is built or installed.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TABLE = ROOT / "hetobs" / "settings_table.py"
HEADER = "| Variable | Default | Values | Meaning |"
# The table is the block of rows right after the Settings section's prose.
_SECTION = re.compile(r"^## Settings\s*$(.*?)(?=^## |\Z)", flags=re.M | re.S)


def _load_settings() -> Any:
    spec = importlib.util.spec_from_file_location("hetobs_settings_table", TABLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module.SETTINGS


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def values(s: Any) -> str:
    """What a setting accepts, from its kind, bounds and choices."""
    if s.kind == "float":
        return f"number >= {_number(s.minimum)}, or inf"
    if s.kind == "int":
        return f"integer {_number(s.minimum)}..{s.maximum}"
    if s.kind in ("choice", "flag"):
        return ", ".join(s.choices)
    if s.kind == "signal":
        return "off, or a signal's name or number"
    return "text"


def render(settings: Any = None) -> str:
    settings = _load_settings() if settings is None else settings
    lines = [HEADER, "| --- | --- | --- | --- |"]
    for s in settings:
        lines.append(f"| `{s.name}` | `{_escape(s.shown_default)}` | {_escape(values(s))} | {_escape(s.doc)} |")
    return "\n".join(lines) + "\n"


def readme_table(text: str) -> str:
    """The settings table as README.md holds it (its rows, each ending in a newline)."""
    match = _SECTION.search(text)
    if not match:
        raise ValueError("README.md has no '## Settings' section")
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")]
    return "".join(row + "\n" for row in rows)


def write_readme() -> bool:
    """Replace README.md's settings table with the rendered one; True when it changed."""
    text = README.read_text(encoding="utf-8")
    old = readme_table(text)
    if not old:
        raise ValueError("README.md's Settings section has no table")
    new = render()
    if old == new:
        return False
    README.write_text(text.replace(old, new, 1), encoding="utf-8")
    return True


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print("README.md updated" if write_readme() else "README.md already up to date", file=sys.stderr)
    elif sys.argv[1:]:
        sys.exit(__doc__)
    else:
        sys.stdout.write(render())
