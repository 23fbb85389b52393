"""Launch the demo job, inject a fault, wait for the evidence, diagnose it, clean up.

A library (the CLI prints; this returns): `run_demo(...)` returns the diagnosis Report
with what it took. Every process it starts is killed and every namespace it makes is
deleted before it returns, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..config import job_root, setting
from ..diagnosis import Options, Report, diagnose
from ..launch_local import LocalJob, new_job_id
from ..line_reader import LineEnd, LineReader, LineTimeout

__all__ = ["FAULTS", "DemoResult", "run_demo", "DemoError", "EXPECTED"]

FAULTS = ("kill", "stop", "sleep", "mismatch", "link", "deadlock", "slow", "none")
_HANGS = {"stop", "sleep", "link", "deadlock"}  # the watchdog has to find these
_ERRORS = {"kill", "mismatch"}  # an op fails and dumps at once
# What a correct diagnosis says about each fault (None: the job is healthy).
EXPECTED = {"kill": "rank_dead", "stop": "rank_unresponsive", "sleep": "rank_not_joined",
            "mismatch": "op_mismatch", "link": "link_stalled", "deadlock": "deadlock", "slow": None, "none": None}


class DemoError(RuntimeError):
    """The demo could not run (no root for the link fault, a rank failed to start, ...)."""


@dataclass
class DemoResult:
    report: Report
    job: str
    job_dir: Path
    fault: str
    culprit: int
    link: Optional[tuple[int, int]] = None
    seconds_to_evidence: float = 0.0
    seconds_total: float = 0.0
    rank_output: dict[int, str] = field(default_factory=dict)

    @property
    def found_the_fault(self) -> bool:
        """The diagnosis names exactly the injected culprit (or link), and nothing else."""
        want = EXPECTED[self.fault]
        verdicts = self.report.verdicts
        if want is None:
            return self.report.status.value == "healthy"
        if not verdicts or verdicts[0].kind.value != want:
            return False
        top = verdicts[0]
        if self.fault == "link":
            return [tuple(x) for x in top.links] == [self.link] and not top.ranks
        if self.fault == "deadlock":
            return self.culprit in top.ranks
        return list(top.ranks) == [self.culprit]


def _transport() -> str:
    """The caller's HETOBS_TRANSPORT when set (checked), else shm: the demo's ranks share a host."""
    return str(setting("HETOBS_TRANSPORT")) if "HETOBS_TRANSPORT" in os.environ else "shm"


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)


class _Job:
    """The demo's ranks: `python -m hetobs.demo.rank` on hetobs.launch_local, each printing
    "READY <json>" once connected (read from its stdout pipe)."""

    def __init__(self, world: int, fault: str, culprit: int, at: int, ops: int, root: Path, hang_timeout: float,
                 netns: Optional[str], logs: Path) -> None:
        argv = [sys.executable, "-m", "hetobs.demo.rank"]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        self.local = LocalJob(argv, world, log_dir=logs, hetobs_dir=root, job_id=new_job_id("demo-"),
                              stdin="pipe", stdout="pipe",
                              env={"HETOBS_HANG_TIMEOUT": str(hang_timeout), "HETOBS_TIMEOUT": "120",
                                   "HETOBS_CONNECT_TIMEOUT": "30",
                                   "HETOBS_TRANSPORT": "tcp" if netns else _transport(),
                                   "HETOBS_DEMO_FAULT": fault, "HETOBS_DEMO_CULPRIT": str(culprit),
                                   "HETOBS_DEMO_AT": str(at), "HETOBS_DEMO_OPS": str(ops), "HETOBS_DEBUG": "ERROR",
                                   "OMP_NUM_THREADS": "1", "HETOBS_SECRET": None})
        self.job = self.local.job_id
        self.local.start()
        self.procs = self.local.procs
        self.lines = LineReader([p.stdout.fileno() for p in self.procs if p.stdout is not None])

    def ready(self, timeout: float) -> list[dict]:
        """Every rank's READY card, in rank order."""
        cards: dict[int, dict] = {}
        end = time.monotonic() + timeout
        while len(cards) < len(self.procs):
            try:
                got = self.lines.read([r for r in range(len(self.procs)) if r not in cards], end - time.monotonic())
            except LineTimeout as e:
                raise DemoError(f"rank(s) {e.missing} did not start within {timeout:.0f} s") from None
            except LineEnd as e:
                try:
                    self.procs[e.source].wait(timeout=5)  # its stderr is complete once it exited
                except subprocess.TimeoutExpired:
                    pass
                raise DemoError(f"rank {e.source} exited before connecting: {self.output(e.source)[-2000:]}") from None
            for r, line in got.items():
                if line.startswith(b"READY "):
                    cards[r] = json.loads(line[6:])
        return [cards[r] for r in range(len(self.procs))]

    def go(self) -> None:
        """Tell rank 0 that the link fault is in place."""
        stdin = self.procs[0].stdin
        assert stdin is not None
        stdin.write(b"go\n")
        stdin.flush()

    def output(self, rank: int) -> str:
        """What the rank printed (stdout as read so far, then the end of its stderr)."""
        return self.lines.seen(rank) + self.local.tail(rank, "err", lines=40)

    def kill(self) -> None:
        self.local.kill()
        self.lines.drain(timeout=5)  # what the ranks printed after READY, for rank_output
        self.local.close()
        for name in os.listdir("/dev/shm"):
            if name.startswith(f"hetobs-stats-{self.job}-"):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass


def _incident_complete(job_dir: Path, expect: int) -> bool:
    inc = job_dir / "incidents"
    if not inc.exists():
        return False
    return any(len([f for f in os.listdir(inc / d) if f.endswith(".json")]) >= expect for d in os.listdir(inc))


def _wait(pred: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)  # files appear by rename from other processes: nothing to block on
    return pred()


def run_demo(*, world: int = 4, fault: str = "sleep", culprit: int = 1, at: int = 5, ops: int = 20,
             hang_timeout: float = 2.0, workdir: Optional[Path] = None,
             progress: Callable[[str], None] = lambda s: None) -> DemoResult:
    """Run the demo job with one fault and diagnose it."""
    if fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: expected one of {', '.join(FAULTS)}")
    if not 2 <= world <= 64 or not 0 <= culprit < world:
        raise ValueError(f"world {world}, culprit {culprit}: need 2 <= world and 0 <= culprit < world")
    if fault == "link" and (os.geteuid() != 0 or not shutil.which("iptables")):
        raise DemoError("the link fault needs root and iptables (a private network namespace gets a DROP rule)")
    root = Path(workdir) if workdir else Path(job_root())
    netns = f"hetobs-demo-{uuid.uuid4().hex[:6]}" if fault == "link" else None
    t0 = time.monotonic()
    link: Optional[tuple[int, int]] = None
    logs = Path(tempfile.mkdtemp(prefix="hetobs-demo-logs-"))
    job: Optional[_Job] = None
    output: dict[int, str] = {}
    try:
        if netns:
            _run("ip", "netns", "add", netns)
            _run("ip", "-n", netns, "link", "set", "lo", "up")
        job = _Job(world, fault, culprit, at, ops, root, hang_timeout, netns, logs)
        job_dir = root / job.job
        progress(f"started {world} ranks (job {job.job}); fault: {fault} on rank {culprit} at op {at}")
        cards = job.ready(60)
        if fault == "link":
            assert netns is not None
            link = (culprit, (culprit + 1) % world)
            src = next(c for c in cards if c["rank"] == link[0])
            conn = next(lk for lk in src["links"] if lk["peer"] == link[1])
            sport = conn["local_address"].rsplit(":", 1)[1]
            dport = conn["remote_address"].rsplit(":", 1)[1]
            assert netns is not None  # made above for fault "link"
            _run("ip", "netns", "exec", netns, "iptables", "-A", "OUTPUT", "-p", "tcp", "--sport", sport, "--dport",
                 dport, "-j", "DROP")
            progress(f"dropping every packet of the ring link {link[0]} -> {link[1]} (ports {sport} -> {dport})")
            job.go()
        if fault in _HANGS or fault in _ERRORS:
            live = world - (1 if fault in ("kill", "stop") else 0)
            progress("waiting for the watchdog and the dumps" if fault in _HANGS else "waiting for the error dumps")
            found = _wait(lambda: _incident_complete(job_dir, live), hang_timeout + 30)
            if fault == "kill" or fault == "mismatch":
                job.local.wait(30)  # every rank ends on the error (the killed culprit first)
            if not found:
                progress("no complete incident appeared in time; diagnosing what is there")
        else:
            progress("running to completion")
            job.local.wait(120)
        t_evidence = time.monotonic() - t0
        progress("diagnosing")
        report = diagnose(Options(job_dir=job_dir, job=job.job))
    finally:
        if job is not None:
            job.kill()
            output = {r: job.output(r) for r in range(len(job.procs))}
        shutil.rmtree(logs, ignore_errors=True)
        if netns:
            subprocess.run(["ip", "netns", "del", netns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return DemoResult(report=report, job=job.job, job_dir=job_dir, fault=fault, culprit=culprit, link=link,
                      seconds_to_evidence=t_evidence, seconds_total=time.monotonic() - t0, rank_output=output)
