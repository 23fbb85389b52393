"""Hangs that span islands are diagnosed to the one culprit (real ranks, two islands with
different libraries inside): a rank of one island that never joins, a rank stopped
while its island's library waits on it, and a relay link blackholed between two hosts
(network namespaces, root). At the edges: the blackholed relay diagnosed live from
either host while the incident still forms (the path named one way, no rank), a rank
that calls a different op (named once, its island peers never), and the HTML page
drawing a rank that left no dump in its island."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _chromium import browse, needs_chromium
from _inline import InlineJob, incident_ranks, wait_until
from hetobs.diagnosis import Options, diagnose
from hetobs.report_html import load_for_report, render_html
from netns import NETNS_SKIP_REASON, Hosts, drop_incoming

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


def stopped_job(tmp_path: Path) -> InlineJob:
    """The STOPPED program, running until its hang dumps are in; the caller kills it."""
    ready = str(tmp_path / "ready-")
    job = InlineJob(STOPPED, 4, tmp_path, env={**HANG, "READY": ready}, rank_env=island_env(LAYOUT))
    try:
        wait_until(lambda: all(os.path.exists(ready + str(r)) for r in range(4)), 90, "the ranks to run")
        wait_until(lambda: any({0, 1, 3} <= ranks for ranks in incident_ranks(job).values()), 30, "hang dumps")
    except BaseException:
        job.kill()
        raise
    return job


@pytest.mark.slow
def test_a_stopped_rank_is_named_with_its_island_and_the_vendor_op_waiting_on_it(tmp_path: Path) -> None:
    with stopped_job(tmp_path) as job:
        data = report(job)
        job.kill()
    top = data["verdicts"][0]
    assert (top["kind"], top["ranks"]) == ("rank_unresponsive", [2]), data["verdicts"]
    assert "island a" in top["summary"], top["summary"]
    # What the vendor wrapper recorded: rank 0 waits inside its island's Gloo op.
    assert any("gloo" in e and "rank 0" in e for e in top["evidence"]), top["evidence"]
    assert blamed(data) == {2}, data["verdicts"]


# A vendor library hetobs has no wrapper of its own for (as HCCL or XCCL through their torch
# plugins): here a torch plugin written in Python over Gloo, since neither runs on this
# machine. Its ops go through hetobs's generic (Python) wrapper.
STOPPED_IN_PLUGIN = """
import os, signal, datetime, torch, torch.distributed as dist
import hetobs

class StubCCL(dist.ProcessGroup):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self.g = dist.ProcessGroupGloo(store, rank, size, timeout)
    def getBackendName(self): return "stubccl"
    def allreduce(self, ts, opts): return self.g.allreduce(ts, opts)
    def _reduce_scatter_base(self, out, inp, opts): return self.g._reduce_scatter_base(out, inp, opts)
    def _allgather_base(self, out, inp, opts): return self.g._allgather_base(out, inp, opts)
    def broadcast(self, ts, opts): return self.g.broadcast(ts, opts)
    def barrier(self, opts): return self.g.barrier(opts)
    def shutdown(self): self.g.shutdown()

def create(opts, backend_options=None):
    return StubCCL(opts.store, opts.group_rank, opts.group_size, opts.timeout)

dist.Backend.register_backend("stubccl", create, extended_api=True, devices=["cpu"])
dist.init_process_group("hetobs_islands", timeout=datetime.timedelta(seconds=30))
x = torch.ones(200000)
for i in range(8):
    if i == 5:
        open(os.environ["READY"] + str(dist.get_rank()), "w").close()
        if dist.get_rank() == 3:  # its island peer (rank 1) waits for it inside the plugin's op
            os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(x)
    x.fill_(1)
"""


@pytest.mark.slow
def test_a_rank_stopped_in_an_island_of_a_plugin_library_is_named_with_the_plugin_op(tmp_path: Path) -> None:
    ready = str(tmp_path / "ready-")
    layout = {0: ("a", "gloo"), 1: ("b", "stubccl"), 2: ("a", "gloo"), 3: ("b", "stubccl")}
    with InlineJob(STOPPED_IN_PLUGIN, 4, tmp_path, env={**HANG, "READY": ready},
                   rank_env=island_env(layout)) as job:
        wait_until(lambda: all(os.path.exists(ready + str(r)) for r in range(4)), 90, "the ranks to run")
        wait_until(lambda: any({0, 1, 2} <= ranks for ranks in incident_ranks(job).values()), 30, "hang dumps")
        data = report(job)
        job.kill()
    top = data["verdicts"][0]
    assert (top["kind"], top["ranks"]) == ("rank_unresponsive", [3]), data["verdicts"]
    assert "island b" in top["summary"], top["summary"]
    # What the generic wrapper recorded: rank 1 waits inside the plugin's op of island b.
    assert any("stubccl:island:b" in e and "rank 1" in e for e in top["evidence"]), top["evidence"]
    assert blamed(data) == {3}, data["verdicts"]


# The start of the programs below: tensors on the rank's island device (HETOBS_ISLAND_DEVICE;
# an island of the stand-in accelerator imports it, which registers its library sccl).
ON_DEVICE = """
import os, time, datetime, torch, torch.distributed as dist
import hetobs
device = os.environ.get("HETOBS_ISLAND_DEVICE", "cpu")
if device == "standin":
    import hetobs_standin
dist.init_process_group("hetobs_islands", timeout=datetime.timedelta(seconds=30))
"""
BLACKHOLE = ON_DEVICE + """
x = torch.ones(100000, device=device)
for i in range(8):
    if i == 3:
        open(os.environ["READY"] + str(dist.get_rank()), "w").close()
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.01)
    dist.all_reduce(x)
"""


@pytest.mark.slow
@pytest.mark.skipif(NETNS_SKIP_REASON is not None, reason=str(NETNS_SKIP_REASON))
# Equal islands cross by a native all_reduce among counterparts; HETOBS_RELAY_STAGE=host
# takes the pipelined relay with its staging copies (the path of device tensors).
@pytest.mark.parametrize("crossing", [{}, {"HETOBS_RELAY_STAGE": "host"}], ids=["counterparts", "staged relay"])
def test_a_blackholed_relay_link_between_hosts_is_named_and_no_rank_is_blamed(crossing: dict[str, str],
                                                                                tmp_path: Path) -> None:
    ready, go = str(tmp_path / "ready-"), str(tmp_path / "go")
    layout = {0: ("a", "gloo"), 1: ("a", "gloo"), 2: ("b", "gloo"), 3: ("b", "gloo")}
    env = {**HANG, "HETOBS_HANG_TIMEOUT": "1.5", "READY": ready, "GO": go, "GLOO_SOCKET_IFNAME": "lo", **crossing}
    with Hosts(2) as hosts:
        prefix = [hosts.prefix(0), hosts.prefix(0), hosts.prefix(1), hosts.prefix(1)]
        with InlineJob(BLACKHOLE, 4, tmp_path, env=env, rank_env=island_env(layout), transport="auto",
                       master_addr=hosts.addrs[0], prefix=prefix) as job:
            wait_until(lambda: all(os.path.exists(ready + str(r)) for r in range(4)), 90, "the ranks to run")
            # Host 1 hears nothing from host 0 from now on: island a's relay sends vanish.
            hosts.run(1, "iptables", "-A", "INPUT", "-s", hosts.addrs[0], "-j", "DROP")
            Path(go).touch()
            wait_until(lambda: any(set(range(4)) <= ranks for ranks in incident_ranks(job).values()), 30,
                      "hang dumps")
            data = report(job)
            job.kill()
    assert blamed(data) == set(), data["verdicts"]
    links = {tuple(link) for v in data["verdicts"] if v["kind"] == "link_stalled" for link in v["links"]}
    assert links and links <= {(0, 2), (0, 3), (1, 2), (1, 3)}, data["verdicts"]
    assert any("wire" in e for v in data["verdicts"] for e in v["evidence"]), data["verdicts"]


CUT = {0: ("a", "gloo"), 1: ("a", "gloo"), 2: ("b", "gloo"), 3: ("b", "gloo")}  # island a on host 0, b on host 1
CUT_LINKS = {(0, 2), (0, 3), (1, 2), (1, 3)}  # host 0 -> host 1: the direction that loses packets


@pytest.mark.slow
@pytest.mark.skipif(NETNS_SKIP_REASON is not None, reason=str(NETNS_SKIP_REASON))
# Which host diagnoses, and whose watchdog has not fired yet (its hang timeout is long): the
# incident is still forming when the operator looks. Island b on the stand-in accelerator
# relays through its device copies (stage device) with its library sccl inside.
@pytest.mark.parametrize("diagnose_on, late, device_b", [(0, 1, "cpu"), (1, 0, "cpu"), (0, 0, "cpu"),
                                                         (0, 1, "standin")],
                         ids=["near side, far side not dumped", "far side, near side not dumped",
                              "near side, its own side not dumped", "standin island, far side not dumped"])
def test_live_diagnose_of_a_cut_relay_names_the_path_one_way_and_no_rank(diagnose_on: int, late: int, device_b: str,
                                                                          tmp_path: Path) -> None:
    ready, go = str(tmp_path / "ready-"), str(tmp_path / "go")
    # No op times out while the test looks (the job is killed at its end): only the cut is wrong.
    env = {**HANG, "HETOBS_HANG_TIMEOUT": "1.5", "HETOBS_TIMEOUT": "600", "READY": ready, "GO": go,
           "GLOO_SOCKET_IFNAME": "lo", "HETOBS_RELAY_STAGE": "host"}  # the staged relay: its own p2p incidents
    rank_env = island_env(CUT)
    dumping = [r for r in CUT if r // 2 != late]
    for r in CUT:
        if r // 2 == late:
            rank_env[r]["HETOBS_HANG_TIMEOUT"] = "300"
        if r // 2 == 1 and device_b == "standin":
            rank_env[r].update(HETOBS_ISLAND_BACKEND="sccl", HETOBS_ISLAND_DEVICE="standin")
    with Hosts(2) as hosts:
        prefix = [hosts.prefix(r // 2) for r in CUT]
        with InlineJob(BLACKHOLE, 4, tmp_path, env=env, rank_env=rank_env, transport="auto",
                       master_addr=hosts.addrs[0], prefix=prefix) as job:
            wait_until(lambda: all(os.path.exists(ready + str(r)) for r in CUT), 90, "the ranks to run")
            drop_incoming(hosts, 1, 0)  # what host 0 sends host 1 is lost, both data and side channel
            Path(go).touch()
            wait_until(lambda: set(dumping) <= set().union(*incident_ranks(job).values(), set()), 60,
                       f"dumps of ranks {dumping}")
            p = subprocess.run([*hosts.prefix(diagnose_on), sys.executable, "-m", "hetobs.cli", "diagnose", "--job",
                                job.job_id, "--dir", str(job.dir), "--json"], capture_output=True, text=True,
                               timeout=120)
            job.kill()
    assert p.returncode == 1, p.stderr[-2000:]
    data = json.loads(p.stdout)
    assert blamed(data) == set(), data["verdicts"]
    links = {tuple(link) for v in data["verdicts"] if v["kind"] == "link_stalled" for link in v["links"]}
    assert links and links <= CUT_LINKS, data["verdicts"]
    assert any("fresh on-demand dump" in n for n in data["notes"]), data["notes"]


OTHER_OP = ON_DEVICE + """
x = torch.ones(1000, device=device)
for i in range(6):
    if i == 3 and dist.get_rank() == 3:  # everyone else calls all_reduce here
        dist.all_gather_into_tensor(torch.empty(1000 * dist.get_world_size(), device=device), x)
    else:
        dist.all_reduce(x)
"""
STANDIN_B = {0: ("a", "gloo"), 1: ("b", "sccl"), 2: ("a", "gloo"), 3: ("b", "sccl")}


@pytest.mark.slow
# Rank 3's island b runs its own library inside: Gloo with two ranks (no majority there), the
# native transport (which fails on the disagreement, each side voting), Gloo with three ranks,
# the stand-in accelerator's library sccl.
@pytest.mark.parametrize("layout", [LAYOUT, {0: ("a", "gloo"), 1: ("b", "hetobs"), 2: ("a", "gloo"),
                                             3: ("b", "hetobs")},
                                    {0: ("a", "gloo"), 1: ("b", "gloo"), 2: ("b", "gloo"), 3: ("b", "gloo")},
                                    STANDIN_B],
                         ids=["gloo 2+2", "native island", "gloo 1+3", "standin 2+2"])
def test_a_rank_calling_another_op_is_named_once_and_its_island_peers_never(layout: dict[int, tuple[str, str]],
                                                                            tmp_path: Path) -> None:
    rank_env = island_env(layout)
    for r, (_, library) in layout.items():
        rank_env[r].update({"HETOBS_ISLAND_DEVICE": "standin"} if library == "sccl" else {})
    with InlineJob(OTHER_OP, 4, tmp_path, env=HANG, rank_env=rank_env) as job:
        wait_until(lambda: any(set(range(4)) <= ranks for ranks in incident_ranks(job).values()), 60, "hang dumps")
        data = report(job)
        job.kill()
    faults = [v for v in data["verdicts"] if v["kind"] not in ("straggler", "slow_link")]
    assert [(v["kind"], v["ranks"]) for v in faults] == [("op_mismatch", [3])], data["verdicts"]
    top = faults[0]
    assert "island b" in top["summary"] and top["islands"] == {"3": "b"}, top
    # The island's own communicator disagreed too (rank 3's all_gather against its island peers'
    # all_reduce): said once, as a consequence, on the deviant's verdict.
    assert any("consequence" in e for e in top["evidence"]), top["evidence"]
    assert blamed(data) == {3}, data["verdicts"]


@needs_chromium
@pytest.mark.slow
# Rank 2 is stopped: it leaves no dump. Its island comes from its rank file, and with that
# gone too, from its island library's communicator file (comms/comm-*.json).
@pytest.mark.parametrize("rank_file", ["kept", "removed"])
def test_the_page_draws_a_rank_without_a_dump_in_its_island(rank_file: str, tmp_path: Path) -> None:
    with stopped_job(tmp_path) as job:
        job.kill()
    job_dir = job.dir / job.job_id
    if rank_file == "removed":
        (job_dir / "ranks" / "rank-2.json").unlink()
    options = Options(job_dir=job_dir)
    rep = diagnose(options)
    assert {r for v in rep.verdicts for r in v.ranks} == {2}, [v.to_dict() for v in rep.verdicts]
    page = tmp_path / "islands.html"
    page.write_text(render_html(rep, load_for_report(options, rep)), encoding="utf-8")
    b = browse(page, tmp_path)
    assert b.console == [], b.console
    assert 'data-rendered="ok"' in b.dom
    ring = re.search(r'<svg[^>]*id="ring-svg".*?</svg>', b.dom, re.S)
    assert ring is not None
    # One group per island, each with both its ranks: the culprit is not set apart as "(no island)".
    names = re.findall(r'<text[^>]*class="island-name"[^>]*>([^<]*)</text>', ring.group(0))
    assert sorted(names) == ["a", "b"], names
    groups = re.findall(r'class="island"[^>]*><title>island ([^:]*): (\d+) rank', ring.group(0))
    assert sorted(groups) == [("a", "2"), ("b", "2")], groups
    detail = re.search(r'id="zoom-detail">([^<]*)<', b.dom)
    assert detail and detail.group(1).startswith("rank 2 · ") and " · BLAMED · " in detail.group(1) \
        and " · island a" in detail.group(1), detail
