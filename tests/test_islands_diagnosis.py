"""Hangs that span islands are diagnosed to the one culprit (real ranks, two islands with
different libraries inside): a rank of one island that never joins, a rank stopped
while its island's library waits on it, and a relay link blackholed between two hosts
(network namespaces, root)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from _inline import InlineJob
from hetobs.diagnosis import Options, diagnose
from netns import NETNS_SKIP_REASON, Hosts

pytest.importorskip("torch")

LAYOUT = {0: ("a", "gloo"), 1: ("b", "hetobs"), 2: ("a", "gloo"), 3: ("b", "hetobs")}
HANG = {"HETOBS_HANG_TIMEOUT": "1", "HETOBS_TIMEOUT": "20"}


def island_env(layout: dict[int, tuple[str, str]]) -> dict[int, dict[str, str]]:
    return {r: {"HETOBS_ISLAND": i, "HETOBS_ISLAND_BACKEND": b} for r, (i, b) in layout.items()}


def report(job: InlineJob) -> dict:
    return json.loads(diagnose(Options(job_dir=job.dir / job.job_id)).to_json())


def blamed(data: dict) -> set[int]:
    return {r for v in data["verdicts"] for r in v["ranks"]}


SLEEPER = """
import time, torch, torch.distributed as dist
import hetobs
def loading_the_next_batch():
    time.sleep(4)
dist.init_process_group("hetobs_islands")
x = torch.ones(5000)
for i in range(6):
    if i == 3 and dist.get_rank() == 3:
        loading_the_next_batch()
    dist.all_reduce(x)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_rank_of_one_island_that_never_joins_is_named_with_its_island(tmp_path: Path) -> None:
    with InlineJob(SLEEPER, 4, tmp_path, env=HANG, rank_env=island_env(LAYOUT)) as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-1500:] for r in runs]
    data = report(job)
    top = data["verdicts"][0]
    assert (top["kind"], top["ranks"], top["op"]) == ("rank_not_joined", [3], "all_reduce"), data["verdicts"]
    assert "island b" in top["summary"], top["summary"]
    assert any("loading_the_next_batch" in e for e in top["evidence"]), top["evidence"]
    assert blamed(data) == {3}, data["verdicts"]


STOPPED = """
import os, signal, datetime, torch, torch.distributed as dist
import hetobs
dist.init_process_group("hetobs_islands", timeout=datetime.timedelta(seconds=30))
x = torch.ones(200000)
for i in range(8):
    if i == 5:
        open(os.environ["READY"] + str(dist.get_rank()), "w").close()
        if dist.get_rank() == 2:  # stopped between ops: its island peer waits for it inside Gloo
            os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(x)
    x.fill_(1)
"""


def _wait_for(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _hang_dumps(job: InlineJob) -> dict[str, set[int]]:
    base = job.dir / job.job_id / "incidents"
    out: dict[str, set[int]] = {}
    for inc in os.listdir(base) if base.exists() else []:
        out[inc] = {int(f[5:-5]) for f in os.listdir(base / inc) if f.startswith("rank-") and f.endswith(".json")}
    return out


@pytest.mark.slow
def test_a_stopped_rank_is_named_with_its_island_and_the_vendor_op_waiting_on_it(tmp_path: Path) -> None:
    ready = str(tmp_path / "ready-")
    with InlineJob(STOPPED, 4, tmp_path, env={**HANG, "READY": ready}, rank_env=island_env(LAYOUT)) as job:
        _wait_for(lambda: all(os.path.exists(ready + str(r)) for r in range(4)), 90, "the ranks to run")
        _wait_for(lambda: any({0, 1, 3} <= ranks for ranks in _hang_dumps(job).values()), 30, "hang dumps")
        data = report(job)
        job.kill()
    top = data["verdicts"][0]
    assert (top["kind"], top["ranks"]) == ("rank_unresponsive", [2]), data["verdicts"]
    assert "island a" in top["summary"], top["summary"]
    # What the vendor wrapper recorded: rank 0 waits inside its island's Gloo op.
    assert any("gloo" in e and "rank 0" in e for e in top["evidence"]), top["evidence"]
    assert blamed(data) == {2}, data["verdicts"]


BLACKHOLE = """
import os, time, datetime, torch, torch.distributed as dist
import hetobs
dist.init_process_group("hetobs_islands", timeout=datetime.timedelta(seconds=30))
x = torch.ones(100000)
for i in range(8):
    if i == 3:
        open(os.environ["READY"] + str(dist.get_rank()), "w").close()
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.01)
    dist.all_reduce(x)
"""


@pytest.mark.slow
@pytest.mark.skipif(NETNS_SKIP_REASON is not None, reason=str(NETNS_SKIP_REASON))
def test_a_blackholed_relay_link_between_hosts_is_named_and_no_rank_is_blamed(tmp_path: Path) -> None:
    ready, go = str(tmp_path / "ready-"), str(tmp_path / "go")
    layout = {0: ("a", "gloo"), 1: ("a", "gloo"), 2: ("b", "gloo"), 3: ("b", "gloo")}
    env = {**HANG, "HETOBS_HANG_TIMEOUT": "1.5", "READY": ready, "GO": go, "GLOO_SOCKET_IFNAME": "lo"}
    with Hosts(2) as hosts:
        prefix = [hosts.prefix(0), hosts.prefix(0), hosts.prefix(1), hosts.prefix(1)]
        with InlineJob(BLACKHOLE, 4, tmp_path, env=env, rank_env=island_env(layout), transport="auto",
                       master_addr=hosts.addrs[0], prefix=prefix) as job:
            _wait_for(lambda: all(os.path.exists(ready + str(r)) for r in range(4)), 90, "the ranks to run")
            # Host 1 hears nothing from host 0 from now on: island a's relay sends vanish.
            hosts.run(1, "iptables", "-A", "INPUT", "-s", hosts.addrs[0], "-j", "DROP")
            Path(go).touch()
            _wait_for(lambda: any(set(range(4)) <= ranks for ranks in _hang_dumps(job).values()), 30,
                      "hang dumps")
            data = report(job)
            job.kill()
    assert blamed(data) == set(), data["verdicts"]
    links = {tuple(link) for v in data["verdicts"] if v["kind"] == "link_stalled" for link in v["links"]}
    assert links and links <= {(0, 2), (0, 3), (1, 2), (1, 3)}, data["verdicts"]
    assert any("wire" in e for v in data["verdicts"] for e in v["evidence"]), data["verdicts"]
