"""hetobs.diagnosis: localize the faulty rank or link of a hung or failed job, with evidence.

A library (the CLI `hetobs diagnose` is its only printer): `diagnose(Options(...))`
reads a job directory (or Flight Recorder dumps) and returns a `Report` of typed
verdicts. Stages and the report contract: DESIGN.md "Diagnosis, in stages"; the
files it reads: docs/dump-schema.md.
"""

from __future__ import annotations

from .engine import diagnose
from .job import OptionsError
from .types import DataProblem, FreshDump, Options, RankState, Report, RequestDump, Status, Verdict, VerdictKind

__all__ = ["diagnose", "Options", "Report", "Verdict", "VerdictKind", "DataProblem", "RankState", "Status",
           "RequestDump", "FreshDump", "OptionsError"]
