"""The README's settings table must equal hetobs.config.SETTINGS (names and defaults, in order).

Settings are a contract with users; a variable added to config.py but not to the
README (or a changed default) fails here. Fix: paste `python scripts/settings_table.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

from hetobs.config import SETTINGS

README = Path(__file__).resolve().parents[1] / "README.md"


def _cells(line: str) -> list[str]:
    """Split a markdown table row on unescaped pipes, unescape, strip."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    assert parts[0] == "" and parts[-1] == "", f"a table row starts and ends with '|': {line}"
    return [p.strip().replace("\\|", "|") for p in parts[1:-1]]


def _unquote(cell: str) -> str:
    return cell[1:-1] if len(cell) >= 2 and cell[0] == cell[-1] == "`" else cell


def readme_settings() -> list[tuple[str, str]]:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^## Settings\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, "README.md has no '## Settings' section"
    rows = [line for line in match.group(1).splitlines() if line.lstrip().startswith("|")]
    assert len(rows) >= 2, "the Settings section has no table"
    header, sep, *body = rows
    assert [c.lower() for c in _cells(header)] == ["variable", "default", "meaning"], header
    assert set("".join(_cells(sep))) <= set("-: "), sep
    out = []
    for row in body:
        cells = _cells(row)
        assert len(cells) == 3, f"settings row needs 3 cells: {row}"
        out.append((_unquote(cells[0]), _unquote(cells[1])))
    return out


def test_readme_table_equals_settings() -> None:
    expected = [(s.name, s.default) for s in SETTINGS]
    assert readme_settings() == expected, "README settings table drifted: run python scripts/settings_table.py"


def test_every_setting_is_documented() -> None:
    for s in SETTINGS:
        assert s.name.startswith("HETOBS_"), s.name
        assert s.doc.strip(), f"{s.name} has no meaning to document"
