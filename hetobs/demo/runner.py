"""Launch the demo job, inject a fault, wait for the evidence, diagnose it, clean up.

A library (the CLI prints; this returns): `run_demo(...)` returns the diagnosis Report
with what it took. Every process it starts is killed and every namespace it makes is
deleted before it returns, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..config import job_root, setting
from ..diagnosis import Options, Report, diagnose
from ..ports import free_port

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
    def __init__(self, world: int, fault: str, culprit: int, at: int, ops: int, root: Path, hang_timeout: float,
                 netns: Optional[str]) -> None:
        self.job = f"demo-{uuid.uuid4().hex[:8]}"
        self.dir = root
        port = str(free_port())
        self.procs: list[subprocess.Popen[str]] = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       HETOBS_JOB_ID=self.job, HETOBS_DIR=str(root), HETOBS_HANG_TIMEOUT=str(hang_timeout),
                       HETOBS_TIMEOUT="120", HETOBS_CONNECT_TIMEOUT="30",
                       HETOBS_TRANSPORT="tcp" if netns else _transport(),
                       HETOBS_DEMO_FAULT=fault, HETOBS_DEMO_CULPRIT=str(culprit), HETOBS_DEMO_AT=str(at),
                       HETOBS_DEMO_OPS=str(ops), HETOBS_DEBUG="ERROR", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            env.pop("HETOBS_SECRET", None)
            argv = [sys.executable, "-m", "hetobs.demo.rank"]
            if netns:
                argv = ["ip", "netns", "exec", netns, *argv]
            self.procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True, start_new_session=True))
        self.output: dict[int, list[str]] = {r: [] for r in range(world)}

    def ready(self, timeout: float) -> list[dict]:
        out = []
        end = time.monotonic() + timeout
        for r, p in enumerate(self.procs):
            assert p.stdout is not None
            while True:
                if time.monotonic() > end:
                    raise DemoError(f"rank {r} did not start within {timeout:.0f} s")
                line = p.stdout.readline()
                if not line:
                    raise DemoError(f"rank {r} exited before connecting: {''.join(self.output[r])[-2000:]}")
                self.output[r].append(line)
                if line.startswith("READY "):
                    out.append(json.loads(line[6:]))
                    break
        return out

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for r, p in enumerate(self.procs):
            try:
                rest, _ = p.communicate(timeout=10)
                self.output[r].append(rest or "")
            except (subprocess.TimeoutExpired, ValueError):
                pass
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
    if netns:
        _run("ip", "netns", "add", netns)
        _run("ip", "-n", netns, "link", "set", "lo", "up")
    job = _Job(world, fault, culprit, at, ops, root, hang_timeout, netns)
    job_dir = root / job.job
    try:
        progress(f"started {world} ranks (job {job.job}); fault: {fault} on rank {culprit} at op {at}")
        cards = job.ready(60)
        if fault == "link":
            link = (culprit, (culprit + 1) % world)
            src = next(c for c in cards if c["rank"] == link[0])
            conn = next(lk for lk in src["links"] if lk["peer"] == link[1])
            sport = conn["local_address"].rsplit(":", 1)[1]
            dport = conn["remote_address"].rsplit(":", 1)[1]
            _run("ip", "netns", "exec", netns, "iptables", "-A", "OUTPUT", "-p", "tcp", "--sport", sport, "--dport",
                 dport, "-j", "DROP")
            progress(f"dropping every packet of the ring link {link[0]} -> {link[1]} (ports {sport} -> {dport})")
            assert job.procs[0].stdin is not None
            job.procs[0].stdin.write("go\n")
            job.procs[0].stdin.flush()
        if fault in _HANGS or fault in _ERRORS:
            live = world - (1 if fault in ("kill", "stop") else 0)
            progress("waiting for the watchdog and the dumps" if fault in _HANGS else "waiting for the error dumps")
            found = _wait(lambda: _incident_complete(job_dir, live), hang_timeout + 30)
            if fault == "kill" or fault == "mismatch":
                _wait(lambda: all(p.poll() is not None for i, p in enumerate(job.procs) if i != culprit or
                                  fault != "kill"), 30)
            if not found:
                progress("no complete incident appeared in time; diagnosing what is there")
        else:
            progress("running to completion")
            _wait(lambda: all(p.poll() is not None for p in job.procs), 120)
        t_evidence = time.monotonic() - t0
        progress("diagnosing")
        report = diagnose(Options(job_dir=job_dir, job=job.job))
    finally:
        job.kill()
        if netns:
            subprocess.run(["ip", "netns", "del", netns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return DemoResult(report=report, job=job.job, job_dir=job_dir, fault=fault, culprit=culprit, link=link,
                      seconds_to_evidence=t_evidence, seconds_total=time.monotonic() - t0,
                      rank_output={r: "".join(v) for r, v in job.output.items()})
