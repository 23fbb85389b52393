"""Save real incidents written by the runtime as frozen test data (issue 30).

Runs the demo job (hetobs.demo.runner) once per fault kind, 3 ranks, and copies what the
runtime wrote (`ranks/`, `comms/`, `incidents/`, byte for byte) to
tests/data/dumps/<label>/<fault>/, with `fault.json` saying what was injected. The format
version is whatever the built native core writes: run it with the build of that version
(v2.0 was saved from the tree before issue 30, v2.1 after). tests/test_saved_dumps.py checks
that every saved incident keeps loading and keeps naming its culprit.

    .venv/bin/python tests/data/dumps/save_real.py v2.1
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAULTS = {"kill": 1, "stop": 2, "sleep": 0, "mismatch": 1, "deadlock": 2}  # fault -> culprit
WORLD, AT, OPS = 3, 2, 4


def main() -> int:
    from hetobs.demo.runner import run_demo

    label = sys.argv[1]
    for fault, culprit in FAULTS.items():
        with tempfile.TemporaryDirectory(prefix="hetobs-save-") as tmp:
            res = run_demo(world=WORLD, fault=fault, culprit=culprit, at=AT, ops=OPS, hang_timeout=1.5,
                           workdir=Path(tmp))
            if not res.found_the_fault:
                print(f"{fault}: the live diagnosis missed the fault; not saved", file=sys.stderr)
                return 1
            dst = HERE / label / fault
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir(parents=True)
            for part in ("ranks", "comms", "incidents"):
                if (res.job_dir / part).is_dir():
                    shutil.copytree(res.job_dir / part, dst / part)
            versions = sorted({json.loads(p.read_text())["version"] for p in dst.glob("incidents/*/rank-*.json")})
            (dst / "fault.json").write_text(json.dumps(
                {"fault": fault, "culprit": culprit, "world": WORLD, "at": AT, "dump_versions": versions,
                 "made_by": "tests/data/dumps/save_real.py (hetobs.demo.runner.run_demo)"}, indent=1) + "\n")
            print(f"{fault}: saved {dst} ({', '.join(versions)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
