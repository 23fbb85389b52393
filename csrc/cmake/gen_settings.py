"""Write the native settings table (settings_table.inc) from hetobs/settings_table.py.

Run by CMake at build time (csrc/CMakeLists.txt); the .inc holds the rows of
`kSettings` (csrc/include/hetobs/common/env_config.h SettingSpec) and is compiled into
csrc/src/common/env_config.cc. The table file is loaded by path: hetobs itself is not
importable yet when the core is built.

    python gen_settings.py <hetobs/settings_table.py> <out.inc>
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_KIND = {"float": "kFloat", "int": "kInt", "choice": "kChoice", "flag": "kFlag", "signal": "kSignal",
         "text": "kText"}


def _load(path: Path):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("hetobs_settings_table", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _c_string(text: str) -> str:
    # JSON's escapes are valid C escapes for the printable ASCII these names and values are.
    assert text.isascii(), text
    return json.dumps(text)


def _double(value: float) -> str:
    return repr(float(value))


def render(table_path: Path) -> str:
    module = _load(table_path)
    lines = [
        "// Generated from hetobs/settings_table.py by csrc/cmake/gen_settings.py at build time: do not edit.",
        "// {name, kind, default, minimum, maximum, choices (comma-separated)}",
    ]
    for s in module.SETTINGS:
        if s.kind not in _KIND:
            raise SystemExit(f"{table_path}: {s.name}: unknown kind {s.kind!r}")
        if any("," in c for c in s.choices):
            raise SystemExit(f"{table_path}: {s.name}: a choice holds a comma")
        minimum = _double(s.minimum) if s.minimum is not None else "0.0"
        maximum = f"{int(s.maximum)}LL" if s.maximum is not None else "0LL"
        lines.append(f"    {{{_c_string(s.name)}, SettingKind::{_KIND[s.kind]}, {_c_string(s.default)}, {minimum}, "
                     f"{maximum}, {_c_string(','.join(s.choices))}}},")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    text = render(Path(argv[1]))
    out = Path(argv[2])
    # Rewritten only when it changes, so an unchanged table rebuilds nothing.
    if not out.exists() or out.read_text() != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
