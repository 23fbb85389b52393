"""A frozen host (issue 28): every process of one "host" (network namespace) stopped at once.

The ranks on the other host stall, their watchdogs dump, and the stopped ranks answer nobody.
`hetobs diagnose` must give one host-level verdict naming the host and all its ranks (not one
verdict per rank), and `--exclude-hosts` must list that host alone. Needs root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _inline import InlineJob, incident_ranks, wait_until
from netns import NETNS_SKIP_REASON, Hosts

pytestmark = [pytest.mark.skipif(NETNS_SKIP_REASON is not None, reason=str(NETNS_SKIP_REASON)),
              pytest.mark.slow, pytest.mark.root]

LOOP = """
import numpy as np, hetobs
comm = hetobs.init()
x = np.empty(1 << 18, np.float32)  # 1 MiB
i = 0
while True:
    x[:] = comm.rank + i
    comm.all_reduce(x)
    assert np.all(x == comm.size * (comm.size - 1) // 2 + comm.size * i), i
    if i == 0:
        print("STARTED", flush=True)
    i += 1
"""


def test_a_frozen_host_gets_one_host_verdict_and_is_the_only_host_to_exclude(tmp_path: Path) -> None:
    with Hosts(2) as hosts:
        names = [f"node-{i}-{hosts.switch[-6:]}" for i in range(2)]
        prefix = [hosts.named_prefix(0, names[0])] * 2 + [hosts.named_prefix(1, names[1])] * 2
        job = InlineJob(LOOP, 4, tmp_path, env={"HETOBS_HANG_TIMEOUT": "3", "HETOBS_TIMEOUT": "60",
                                                "HETOBS_CONNECT_TIMEOUT": "60"},
                        transport="auto", master_addr=hosts.addrs[0], prefix=prefix)
        stopped: list[int] = []
        try:
            for r in range(4):
                job.wait_line(r, "STARTED")
            # Every process of host 1 at once: its ranks (and anything else running there).
            stopped = hosts.pids(1)
            assert {p.pid for p in job.procs[2:]} <= set(stopped), (stopped, job.pids)
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            # The ranks of host 0 stall; their watchdogs dump (the stopped ones cannot).
            wait_until(lambda: any({0, 1} <= ranks for ranks in incident_ranks(job).values()), 60,
                       "the dumps of host 0's ranks")
            out = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job.job_id, "--dir",
                                  str(job.dir), "--json"], capture_output=True, text=True, timeout=120)
            excl = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job.job_id, "--dir",
                                   str(job.dir), "--exclude-hosts"], capture_output=True, text=True, timeout=120)
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            job.kill()
    assert out.returncode == 1, (out.returncode, out.stdout[-3000:], out.stderr[-2000:])
    report = json.loads(out.stdout)
    faults = [v for v in report["verdicts"] if v["kind"] not in ("straggler", "slow_link")]
    assert len(faults) == 1, report["verdicts"]
    v = faults[0]
    assert v["kind"] == "rank_unresponsive" and v["ranks"] == [2, 3], v
    assert names[1] in v["summary"], v
    assert report["exclude_hosts"] == [names[1]], report["exclude_hosts"]
    assert excl.stdout.split() == [names[1]], (excl.returncode, excl.stdout, excl.stderr)
