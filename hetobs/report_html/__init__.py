"""hetobs.report_html: an incident as one self-contained HTML page (`hetobs diagnose --html FILE`).

A library: `render_html(report, job)` returns the page as a string (no printing, no
files); `load_for_report(options, report)` gives it the dumps the report judged.
What the page draws and how it stays small at thousands of ranks: model.py.
"""

from __future__ import annotations

from .load import load_for_report
from .page import render_html

__all__ = ["render_html", "load_for_report"]
