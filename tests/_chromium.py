"""Pages loaded from disk in a real headless Chromium: the DOM after the page's script ran,
its console and a screenshot (tests/test_report_html.py, tests/test_islands_diagnosis.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

__all__ = ["CHROMIUM", "needs_chromium", "Browsed", "browse"]

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; "
                                                             "scripts/setup.sh installs it)")


class Browsed:
    def __init__(self, dom: str, console: list[str], png: Path) -> None:
        self.dom, self.console, self.png = dom, console, png


def browse(page: Path, tmp: Path) -> Browsed:
    """Load `page` from disk in headless Chromium: the DOM after scripts, console lines, a screenshot."""
    assert CHROMIUM is not None
    png = tmp / (page.stem + ".png")
    profile = tmp / (page.stem + "-profile")  # a private profile: nothing shared with other runs
    p = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
                          "--window-size=1050,1800", f"--screenshot={png}", "--dump-dom", page.as_uri()],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=60)
    finally:  # Chromium's helper processes share its session: none outlives the test
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        shutil.rmtree(profile, ignore_errors=True)
    assert p.returncode == 0, err[-2000:]
    return Browsed(out, [ln for ln in err.splitlines() if ":CONSOLE" in ln], png)
