"""Print the README's settings table from `hetobs.config.SETTINGS`.

The README must mirror SETTINGS exactly (tests/test_readme_settings.py checks it);
after changing a setting, paste this script's output under "## Settings":

    .venv/bin/python scripts/settings_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    from hetobs.config import SETTINGS

    lines = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for s in SETTINGS:
        lines.append(f"| `{s.name}` | `{_escape(s.default)}` | {_escape(s.doc)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # works before the install too
    sys.stdout.write(render())
