"""torch's own distributed test suite against the hetobs torch backends, beside Gloo.

Runs `torch.testing._internal.distributed.distributed_test` (the suite behind pytorch's
test/distributed/test_distributed_spawn.py, shipped in the torch wheel) once per backend,
the way that file runs it: a TestCase mixing `TestDistBackend` and
`DistributedTest._DistTestBase`, each test starting WORLD_SIZE rank processes on CPU
(forked from the worker, or spawned with --start spawn as that file does).

    python bench/torch_conformance.py                       # every test, 4 backends, 2 ranks (4, 8 where needed)
    python bench/torch_conformance.py -k all_reduce -k broadcast --backends gloo,hetobs
    python bench/torch_conformance.py --json out.json --markdown

Gating. The suite decides what a backend is asked to run by its name (decorators such as
`BACKEND != "gloo"`, `DistTestCases.backend_feature["ddp"]`, evaluated when the test class
is made) and some test bodies branch on it (`if BACKEND == "gloo": <a CPU model>`). Every
backend here stands in for Gloo on CPU, so the gates are evaluated as for Gloo (BACKEND=gloo
while the module is imported) and the tests then run on the backend under test: the module's
BACKEND becomes its name, a string that also equals "gloo" (`_AsGloo`), so a body's Gloo
branch is taken while `init_process_group(backend=BACKEND)` and every comparison with
`dist.get_backend()` see the real name. A test Gloo is asked to run, ours are asked to run too.

`hetobs_islands` runs with every rank an island of its own (HETOBS_ISLAND=r<rank>, Gloo
inside), so each collective crosses islands through the host relay.

Output: one table (passed / failed / skipped per backend), then for every test that
passes on Gloo but not on a hetobs backend, that backend's outcome and the first line of its
error; --json writes every outcome. Exit status 0 when it ran (failures are data), 2 on a
usage error, 4 when a backend's worker died or ran out of --timeout. Worker mode (internal):
--worker, with CONFORMANCE_BACKEND in the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any

BACKENDS = ("gloo", "hetobs_gloo", "hetobs", "hetobs_islands")
_WORKER_ENV = "CONFORMANCE_BACKEND"  # the backend under test, in the worker and its rank processes
_JOB_VARS = ("HETOBS_JOB_ID", "HETOBS_DIR", "HETOBS_SECRET", "HETOBS_ISLAND", "RANK", "WORLD_SIZE", "LOCAL_RANK")
_START_ENV = "CONFORMANCE_START"  # how rank processes start: spawn (as test_distributed_spawn.py) or fork


class _AsGloo(str):
    """A backend's name that compares equal to "gloo" as well as to itself (see Gating above)."""

    def __eq__(self, other: object) -> bool:
        return other == "gloo" or str.__eq__(self, other) is True

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _suite_class() -> Any:
    """The suite's test class, gated as for Gloo and run on the backend named by _WORKER_ENV.

    Defined at import in the worker and in every rank process it spawns (they import this
    file as their main module), so spawned ranks find the class by name; forked ones have it.
    """
    backend = os.environ[_WORKER_ENV]
    os.environ["BACKEND"] = "gloo"  # gates read at import (see the module doc)
    import hetobs  # noqa: F401 - registers the hetobs backends when torch.distributed is imported
    import torch.distributed  # noqa: F401
    from torch.testing._internal.distributed import distributed_test as dt

    dt.BACKEND = _AsGloo(backend)
    os.environ["BACKEND"] = backend

    class TestConformance(dt.TestDistBackend, dt.DistributedTest._DistTestBase):  # type: ignore[misc,name-defined]
        def setUp(self) -> None:
            super().setUp()
            if os.environ.get(_START_ENV) == "fork":
                # Ranks forked from the worker, which has imported torch and the suite once:
                # seconds less per test than a fresh interpreter per rank.
                import torch.multiprocessing

                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()

        @classmethod
        def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any) -> None:
            if backend == "hetobs_islands":
                os.environ["HETOBS_ISLAND"] = f"r{rank}"
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    TestConformance.__qualname__ = TestConformance.__name__ = "TestConformance"
    return TestConformance


if os.environ.get(_WORKER_ENV):
    TestConformance = _suite_class()


class _Collect(unittest.TextTestResult):
    """Every test's outcome and, for failures and skips, one line saying why."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.outcomes: dict[str, dict[str, Any]] = {}
        self._t0 = 0.0

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        self._t0 = time.monotonic()
        super().startTest(test)

    def _put(self, test: unittest.TestCase, outcome: str, why: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = {"outcome": outcome, "why": why, "seconds": round(time.monotonic() - self._t0, 2)}

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addSuccess(test)
        self._put(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._put(test, "failed", _reason(self._exc_info_to_string(err, test)))

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._put(test, "failed", _reason(self._exc_info_to_string(err, test)))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._put(test, "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self._put(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._put(test, "failed", "unexpected success")


_NOISE = re.compile(r"^(Traceback|  File |    |During handling|The above exception|Process \d+ exited|"
                    r"Exception raised from|frame #|\s*$|-+$|=+$|RuntimeError: Process \d+ exited with error)")


def _reason(text: str) -> str:
    """The most telling line of a rank's error: the last exception line that is not plumbing."""
    lines = [ln.strip() for ln in text.splitlines() if not _NOISE.match(ln)]
    pick = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Failure)\b|^AssertionError", ln)]
    line = (pick or lines or ["(no message)"])[-1]
    return line[:300]


def _worker(patterns: list[str], out: str) -> int:
    loader = unittest.TestLoader()
    names = sorted(n for n in loader.getTestCaseNames(TestConformance)
                   if not patterns or any(re.search(p, n) for p in patterns))
    suite = unittest.TestSuite(TestConformance(n) for n in names)
    with open(os.devnull, "w") as devnull:
        runner = unittest.TextTestRunner(stream=devnull if os.environ.get("CONFORMANCE_QUIET") else sys.stderr,
                                         resultclass=_Collect, verbosity=2)
        result = runner.run(suite)
    assert isinstance(result, _Collect)
    with open(out, "w") as f:
        json.dump(result.outcomes, f, indent=1, sort_keys=True)
    return 0


def _run_backend(backend: str, patterns: list[str], world: int, timeout: float, quiet: bool,
                 start: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"conformance-{backend}-") as tmp:
        out = os.path.join(tmp, "outcomes.json")
        # A job of its own per test (ids generated, as with no launcher), under a private HETOBS_DIR;
        # other HETOBS_* settings pass (HETOBS_TORCH_NATIVE=0 runs the Python wrappers).
        env = {k: v for k, v in os.environ.items()
               if k not in _JOB_VARS and not k.startswith(("MASTER_", "TORCHELASTIC_", "SLURM_"))}
        env.update({_WORKER_ENV: backend, _START_ENV: start, "WORLD_SIZE": str(world), "TEMP_DIR": tmp,
                    "HETOBS_DIR": os.path.join(tmp, "hetobs"), "OMP_NUM_THREADS": "1",
                    "HETOBS_DEBUG": "ERROR"})
        if quiet:
            env["CONFORMANCE_QUIET"] = "1"
        os.makedirs(os.path.join(tmp, "barrier"))
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out]
        for p in patterns:
            argv += ["-k", p]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, env=env, timeout=timeout, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL if quiet else None)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -1
        try:
            with open(out) as f:
                outcomes = json.load(f)
        except (OSError, ValueError):
            outcomes = {}
        return {"backend": backend, "returncode": rc, "seconds": round(time.monotonic() - t0, 1),
                "outcomes": outcomes}


_FEW_RANKS = re.compile(r"small world ?size|world size of \d|exact world size", re.I)


def _too_few_ranks(runs: list[dict[str, Any]]) -> list[str]:
    """Tests any backend skipped for having too few ranks (the suite's own skip reasons)."""
    return sorted({name for run in runs for name, o in run["outcomes"].items()
                   if o["outcome"] == "skipped" and _FEW_RANKS.search(o["why"])})


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per backend and, per hetobs backend, the tests Gloo passes that it does not."""
    counts = {}
    for run in runs:
        c = {"passed": 0, "failed": 0, "skipped": 0}
        for o in run["outcomes"].values():
            c[o["outcome"]] += 1
        counts[run["backend"]] = c
    gloo = next((r["outcomes"] for r in runs if r["backend"] == "gloo"), {})
    gaps: dict[str, dict[str, Any]] = {}
    for run in runs:
        if run["backend"] == "gloo":
            continue
        gaps[run["backend"]] = {
            name: run["outcomes"].get(name, {"outcome": "missing", "why": "not run (the worker stopped)"})
            for name, o in sorted(gloo.items())
            if o["outcome"] == "passed" and run["outcomes"].get(name, {}).get("outcome") != "passed"}
    return {"counts": counts, "gaps": gaps}


def _wider(outcomes: dict[str, Any]) -> str:
    """How many tests ran (not skipped) at each rank count above --world: "4: 3, 8: 20"."""
    ran: dict[int, int] = {}
    for o in outcomes.values():
        if o.get("world") and o["outcome"] != "skipped":
            ran[o["world"]] = ran.get(o["world"], 0) + 1
    return ", ".join(f"{w}: {n}" for w, n in sorted(ran.items())) or "-"


def _table(runs: list[dict[str, Any]], summary: dict[str, Any], markdown: bool) -> str:
    lines = []
    head = ("backend", "passed", "failed", "skipped", "total", "ran at more ranks", "minutes")
    rows = [(r["backend"], *(str(summary["counts"][r["backend"]][k]) for k in ("passed", "failed", "skipped")),
             str(len(r["outcomes"])), _wider(r["outcomes"]), f"{r['seconds'] / 60:.1f}") for r in runs]
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("| " + " | ".join("---" for _ in head) + " |")
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    for backend, gap in summary["gaps"].items():
        lines.append("")
        lines.append(f"passed on gloo, not on {backend}: {len(gap)}")
        for name, o in gap.items():
            lines.append(f"  {name}: {o['outcome']}: {o['why']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma list (gloo is the reference)")
    ap.add_argument("-k", dest="patterns", action="append", default=[],
                    help="run only tests whose name matches this regular expression (repeatable)")
    ap.add_argument("--world", type=int, default=2, help="ranks per test (default 2)")
    ap.add_argument("--wide", default="4,8",
                    help="rank counts, in order, for the tests that skip themselves for too few ranks: each runs "
                         "again on every backend at the next count until it no longer skips for that (default "
                         "4,8: the suite wants exactly 4 for some, at least 8 for others; 0: none)")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds one backend's run may take")
    ap.add_argument("--json", dest="json_out", help="write every outcome and the summary to this file")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--quiet", action="store_true", help="no per-test progress on stderr")
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork",
                    help="how each test's rank processes start: fork (default: from the worker, which imported "
                         "torch and the suite once) or spawn (a fresh interpreter per rank, as pytorch's "
                         "test_distributed_spawn.py)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args.patterns, args.out)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        ap.error(f"--backends: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(BACKENDS)}")
    if args.world < 2:
        ap.error("--world: at least 2 ranks")
    try:
        widths = [int(w) for w in args.wide.split(",") if w.strip() and int(w) != 0]
    except ValueError:
        ap.error(f"--wide {args.wide!r}: rank counts, comma-separated (e.g. 4,8), or 0")
    if any(w <= args.world for w in widths):
        ap.error(f"--wide {args.wide}: each count above --world ({args.world})")
    runs = []
    for b in backends:
        print(f"conformance: {b} ...", file=sys.stderr, flush=True)
        runs.append(_run_backend(b, args.patterns, args.world, args.timeout, args.quiet, args.start))
    wide: dict[int, list[str]] = {}
    for width in widths:
        names = _too_few_ranks(runs)
        if not names:
            break
        wide[width] = names
        for run in runs:
            print(f"conformance: {run['backend']}, {len(names)} tests at {width} ranks ...", file=sys.stderr,
                  flush=True)
            more = _run_backend(run["backend"], [f"^{n}$" for n in names], width, args.timeout, args.quiet,
                                args.start)
            for name, outcome in more["outcomes"].items():
                run["outcomes"][name] = {**outcome, "world": width}
            run["seconds"] += more["seconds"]
            run["returncode"] = run["returncode"] or more["returncode"]
    summary = summarize(runs)
    print(_table(runs, summary, args.markdown))
    broken = [r for r in runs if r["returncode"] != 0]
    for run in broken:  # the worker itself died or ran out of --timeout: its counts are short
        print(f"conformance: the {run['backend']} worker did not finish (exit {run['returncode']}); its counts "
              "are of the tests it got through", file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"world": args.world, "wide": wide, "patterns": args.patterns, "runs": runs, **summary}, f,
                      indent=1)
    return 4 if broken else 0

if __name__ == "__main__":
    sys.exit(main())
