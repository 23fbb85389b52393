"""Output sink shared by every command: data to stdout, messages to stderr.

Two modes, chosen by the command's `--json` flag:
- human: rich tables and aligned key/value lines on stdout (styled only on a terminal);
- json: exactly one plain `json.dumps` document per call on stdout — never styled,
  wrapped or mixed with messages — so `hetobs X --json | jq` always works.
Messages, warnings and errors go to stderr in both modes.

Streams are looked up at each call (not at construction), so typer's CliRunner and
pytest's capture see everything.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["Output"]

# Wide enough that tables are not squeezed when stdout is a pipe or a CI log
# (rich falls back to 80 columns there); a table is only as wide as its content.
_PIPE_WIDTH = 200


def _jsonable(value: Any) -> Any:
    """json.dumps fallback: numpy scalars/arrays, paths, enums and sets."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "value") and hasattr(type(value), "__members__"):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _cell(value: Any) -> Text:
    # Text, not str: rich would read "[...]" inside values as markup.
    if value is None:
        return Text("-")
    if isinstance(value, float):
        return Text(f"{value:.6g}")
    return Text(str(value))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Output:
    """Where a command writes its results and its messages."""

    def __init__(self, json_mode: bool = False) -> None:
        self.json_mode = json_mode

    # --- data (stdout) ------------------------------------------------------------
    def _stdout(self) -> Console:
        out = sys.stdout
        tty = hasattr(out, "isatty") and out.isatty()
        return Console(file=out, width=None if tty else _PIPE_WIDTH, highlight=False, soft_wrap=False)

    def json(self, data: Any) -> None:
        """Print `data` as one JSON document (in either mode)."""
        sys.stdout.write(json.dumps(data, default=_jsonable) + "\n")
        sys.stdout.flush()

    def table(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
              title: str | None = None) -> None:
        """Rows as a rich table, or as a JSON array of objects (`[]` when empty)."""
        if self.json_mode:
            self.json([dict(r) for r in rows])
            return
        if not rows:
            self.message("(no rows)")
            return
        cols = list(columns) if columns is not None else list(rows[0].keys())
        table = Table(title=title, title_justify="left")
        for col in cols:
            numeric = all(_is_number(r.get(col)) or r.get(col) is None for r in rows)
            table.add_column(col, justify="right" if numeric else "left")
        for r in rows:
            table.add_row(*(_cell(r.get(c)) for c in cols))
        self._stdout().print(table)

    def result(self, data: Mapping[str, Any], title: str | None = None) -> None:
        """A record as aligned `key  value` lines, or as a JSON object.

        Nested mappings are flattened to dotted keys in human mode only.
        """
        if self.json_mode:
            self.json(dict(data))
            return
        items = _flatten(data)
        width = max((len(key) for key, _ in items), default=0)
        console = self._stdout()
        if title:
            console.print(Text(title, style="bold"))
        for key, value in items:  # hand-aligned: a rich grid would pad lines with trailing spaces
            console.print(Text(key.ljust(width), style="bold") + Text("  ") + _cell(value))

    # --- messages (stderr) --------------------------------------------------------
    def _stderr(self, prefix: str, style: str, text: str) -> None:
        console = Console(file=sys.stderr, highlight=False, soft_wrap=True)
        line = Text(prefix, style=style) if prefix else Text()
        line.append(text)
        console.print(line)

    def message(self, text: str) -> None:
        self._stderr("", "", text)

    def hint(self, text: str) -> None:
        self._stderr("hint: ", "dim", text)

    def warning(self, text: str) -> None:
        self._stderr("warning: ", "yellow", text)

    def error(self, text: str) -> None:
        self._stderr("error: ", "bold red", text)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            items.extend(_flatten(value, name + "."))
        else:
            items.append((name, value))
    return items
