"""The HTML incident report at scale: page size and load time in headless Chromium.

The incident is bench/diagnose_scale.py's (one rank never called the last of the
all_reduces on one communicator; every other rank waits in it). For each world size:
`hetobs diagnose --json` alone and with `--html` (wall times, page size), then Chromium loads the page
from disk (`--dump-dom`, wall time, start-up included, next to the same for an empty
page) and the page's own drawing time (`data-render-ms`, set by its script).

    .venv/bin/python bench/report_html_scale.py                 # 64 1024 4096
    .venv/bin/python bench/report_html_scale.py --sizes 4096 --records 50

Target (issue 17): a 4,096-rank incident's page < 5 MB, open in Chromium in a few seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]


def _scale_module():
    spec = importlib.util.spec_from_file_location("diagnose_scale", HERE / "diagnose_scale.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def browse(page: Path) -> tuple[float, str, list[str]]:
    """(wall seconds, DOM, console lines) of one headless Chromium load of `page`."""
    t = time.perf_counter()
    p = subprocess.run(CHROMIUM + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t
    return wall, p.stdout, [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64,1024,4096")
    ap.add_argument("--records", type=int, default=50)
    args = ap.parse_args()
    if shutil.which("chromium") is None:
        sys.exit("chromium is not installed (apt-get install chromium)")
    scale = _scale_module()
    scratch = Path(tempfile.mkdtemp(prefix="hetobs-html-scale-"))
    try:
        blank = scratch / "blank.html"
        blank.write_text("<!DOCTYPE html><html><body><p>blank</p></body></html>")
        blank_s = min(browse(blank)[0] for _ in range(2))
        print(f"{'ranks':>6} {'diagnose s':>11} {'diagnose+html s':>16} {'page MB':>8} {'chromium load s':>16} "
              f"{'blank page s':>13} {'drawing ms':>11}  culprit shown, console")
        for world in [int(s) for s in args.sizes.split(",")]:
            culprit = world // 3
            jobs = scratch / f"n{world}"
            scale.write_hetobs(jobs, "scale", world, culprit, args.records)
            page = scratch / f"n{world}.html"
            cmd = [str(VENV_BIN / "hetobs"), "diagnose", "--job", "scale", "--dir", str(jobs), "--json"]
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, timeout=600)
            plain_s = time.perf_counter() - t
            t = time.perf_counter()
            subprocess.run(cmd + ["--html", str(page)], capture_output=True, timeout=600)
            diag_s = time.perf_counter() - t
            wall, dom, console = browse(page)
            m = re.search(r'data-render-ms="([0-9.]+)"', dom)
            shown = f'data-rank="{culprit}"' in dom and 'data-rendered="ok"' in dom
            print(f"{world:>6} {plain_s:>11.2f} {diag_s:>16.2f} {page.stat().st_size / 1e6:>8.2f} {wall:>16.2f} "
                  f"{blank_s:>13.2f} {m.group(1) if m else '?':>11}  {'yes' if shown else 'NO'}, {len(console)} message(s)")
            shutil.rmtree(jobs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
