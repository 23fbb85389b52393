"""hetobs/_core.pyi against the built native module (mypy's stubtest).

The stub types what Python uses of hetobs._core for mypy (scripts/test.sh runs mypy on the
package). A stub that names something the module does not have, or calls a property a method,
would type-check code that fails at run time: stubtest imports the module and compares.
Names the module has and the stub leaves out are allowed (tests' helpers, internal benches)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_stub_matches_the_built_module() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy.stubtest", "hetobs._core", "--ignore-missing-stub",
                        "--allowlist", str(ROOT / "tests" / "core_stub_allowlist.txt")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
