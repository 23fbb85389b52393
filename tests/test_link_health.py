"""Link health from TCP_INFO, the direction of a one-way blackhole, and `diagnose --window` on live jobs.

Real ranks and sockets; the multi-host cases run on network namespaces (tests/netns.py,
root): a one-way iptables DROP, a tc tbf rate limit of one host. Namespaces take their
interfaces, qdiscs and iptables rules with them when `Hosts` closes; ranks are killed by
InlineJob even when an assertion fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from _inline import InlineJob, incident_ranks, wait_until
from hetobs.diagnosis import Options, diagnose
from hetobs.jobs import request_dump
from netns import NETNS_SKIP_REASON, Hosts, drop_incoming, drop_outgoing, rate_limit

needs_netns = pytest.mark.skipif(NETNS_SKIP_REASON is not None, reason=str(NETNS_SKIP_REASON))


# --- item 3: TCP_INFO in links(), dumps and Prometheus ----------------------------------------------

HEALTH = """
import json, os, time, numpy as np, hetobs
from hetobs import exporters
comm = hetobs.init()
x = np.ones(1 << 18, np.float32)
for _ in range(4):
    comm.all_reduce(x)
port = exporters.start_http_server(0)[0].server_port if comm.rank == 0 else 0
out = os.environ["READY"] + str(comm.rank)
with open(out + ".tmp", "w") as f:
    json.dump({"port": port, "links": comm.links()}, f)
os.rename(out + ".tmp", out)
while not os.path.exists(os.environ["GO"]):
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_links_dump_and_prometheus_show_rtt_and_retransmits_of_tcp_links(tmp_path: Path) -> None:
    ready, go = str(tmp_path / "ready-"), tmp_path / "go"
    with InlineJob(HEALTH, 2, tmp_path, env={"READY": ready, "GO": str(go)}, transport="tcp") as job:
        wait_until(lambda: all(os.path.exists(ready + str(r)) for r in range(2)), 60, "the ranks to run")
        seen = [json.loads(Path(ready + str(r)).read_text()) for r in range(2)]
        with urllib.request.urlopen(f"http://127.0.0.1:{seen[0]['port']}/metrics", timeout=10) as resp:
            scraped = resp.read().decode()
        result = request_dump(str(job.dir / job.job_id), timeout=10)
        top = subprocess.run([sys.executable, "-m", "hetobs.cli", "top", "--job", job.job_id, "--dir", str(job.dir),
                              "--interval", "0.2", "--json"], capture_output=True, text=True, timeout=60)
        go.touch()
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-1500:] for r in runs]
    for s in seen:
        [link] = s["links"]
        tcp = link["tcp"]
        assert link["transport"] == "tcp" and tcp is not None, link
        assert tcp["rtt_us"] > 0 and tcp["retransmits_total"] >= 0 and tcp["bytes_acked"] > 1 << 18, tcp
    dumped = {}
    for r in range(2):
        dump = json.loads((job.dir / job.job_id / "incidents" / result.incident / f"rank-{r}.json").read_text())
        [link] = [lk for c in dump["comms"] for lk in c["links"]]
        assert link["tcp"]["rtt_us"] > 0 and "lost" in link["tcp"], link
        dumped[r] = link["tcp"]
    fams = {f.name: f for f in text_string_to_metric_families(scraped)}
    [rtt] = fams["hetobs_link_rtt_seconds"].samples
    assert rtt.labels["rank"] == "0" and rtt.labels["peer"] == "1" and rtt.labels["transport"] == "tcp"
    assert 0 < rtt.value < 1, rtt
    [retrans] = [s for s in fams["hetobs_link_retransmits"].samples if s.name.endswith("_total")]
    # One counter of rank 0's socket to rank 1, read three times in this order (links(), the scrape,
    # the dump): each surface must show that socket's count, which never goes down.
    first, last = seen[0]["links"][0]["tcp"]["retransmits_total"], dumped[0]["retransmits_total"]
    assert retrans.labels["peer"] == "1" and first <= retrans.value <= last, (first, retrans, last)
    assert dumped[0]["bytes_acked"] >= seen[0]["links"][0]["tcp"]["bytes_acked"], (seen[0], dumped[0])
    # `hetobs top` reads the stats segments, where the watchdog keeps link health fresh.
    assert top.returncode == 0, top.stderr
    rows = json.loads(top.stdout)["links"]
    assert len(rows) == 2 and all(r["rtt_ms"] > 0 for r in rows), rows
    assert all(isinstance(r["retransmits"], int) and r["retransmits"] <= dumped[r["rank"]]["retransmits_total"]
               for r in rows), (rows, dumped)


# --- item 4: a one-way blackhole blames that direction only -------------------------------------------

LOOP = """
import os, time, numpy as np, hetobs
comm = hetobs.init()
x = np.ones(1 << 22, np.float32)  # 16 MiB: more than the socket buffers hold, so both directions stall
for i in range(1000):
    if i == 3:
        open(os.environ["READY"] + str(comm.rank), "w").close()
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.01)
    comm.all_reduce(x)
"""


@pytest.mark.slow
@needs_netns
# Three runs (the old code blamed both directions in 2 runs of 3), the drop at either end of 1 -> 0.
@pytest.mark.parametrize("where", ["sender_output", "receiver_input", "sender_output_again"])
def test_a_one_way_blackhole_is_blamed_on_that_direction_only(tmp_path: Path, where: str) -> None:
    ready, go = str(tmp_path / "ready-"), tmp_path / "go"
    env = {"READY": ready, "GO": str(go), "HETOBS_HANG_TIMEOUT": "1.5", "HETOBS_TIMEOUT": "30"}
    with Hosts(2) as hosts:
        with InlineJob(LOOP, 2, tmp_path, env=env, transport="auto", master_addr=hosts.addrs[0],
                       prefix=[hosts.prefix(0), hosts.prefix(1)]) as job:
            wait_until(lambda: all(os.path.exists(ready + str(r)) for r in range(2)), 60, "the ranks to run")
            # host 1 -> host 0 vanishes; host 0 -> host 1 still flows
            if where == "receiver_input":
                drop_incoming(hosts, 0, frm=1)
            else:
                drop_outgoing(hosts, 1, to=0)
            go.touch()
            wait_until(lambda: any({0, 1} <= r for r in incident_ranks(job).values()), 40, "hang dumps of both ranks")
            data = json.loads(diagnose(Options(job_dir=job.dir / job.job_id)).to_json())
            job.kill()
    assert {r for v in data["verdicts"] for r in v["ranks"]} == set(), data["verdicts"]
    links = {tuple(lk) for v in data["verdicts"] if v["kind"] == "link_stalled" for lk in v["links"]}
    assert links == {(1, 0)}, data["verdicts"]
    [v] = [v for v in data["verdicts"] if v["kind"] == "link_stalled"]
    assert any("packets from 1 to 0 are lost" in e for e in v["evidence"]), v["evidence"]


# --- item 5: `diagnose --window` on live jobs --------------------------------------------------------

CRAWL = """
import os, time, numpy as np, hetobs
comm = hetobs.init()
compute_s = float(os.environ.get("COMPUTE_S", "0.01")) * (3 if str(comm.rank) == os.environ.get("SLOW_RANK") else 1)
x = np.ones(int(os.environ.get("COUNT", "16384")), np.float32)
i = 0
while not os.path.exists(os.environ["STOP"]):
    if i == 3:
        open(os.environ["READY"] + str(comm.rank), "w").close()
    time.sleep(compute_s)  # stands for the step's compute, not for synchronization
    comm.all_reduce(x)
    i += 1
"""


def _window(job: InlineJob, seconds: float, prefix: list[str] | None = None) -> tuple[int, dict]:
    """`hetobs diagnose --job ID --window SECONDS --json` as a user runs it (on host `prefix`, if any)."""
    argv = [*(prefix or []), sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job.job_id,
            "--dir", str(job.dir), "--window", str(seconds), "--json"]
    env = dict(os.environ, HETOBS_DIR=str(job.dir))
    env.pop("HETOBS_SECRET", None)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert r.stdout.strip(), r.stderr
    data = json.loads(r.stdout)
    # Judged on a dump taken now, never on an older incident (else a window test could pass on stale data).
    assert str(data["incident"]).startswith("ondemand-"), data
    return r.returncode, data


WINDOWS = """
import json, sys, time
from pathlib import Path
from hetobs.cli.diagnose import _heartbeat, _last_progress, _request_dump
from hetobs.diagnosis import Options, diagnose
job_dir, job, n, w = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
reports = []
for _ in range(n):
    time.sleep(w)  # each window starts after the previous one's dump: no op is judged twice
    reports.append(diagnose(Options(job_dir=job_dir, job=job, request_dump=_request_dump(), heartbeat=_heartbeat,
                                    last_progress=_last_progress(job), window_s=w)).to_dict())
print(json.dumps(reports))
"""


def _windows(job: InlineJob, n: int, seconds: float, prefix: list[str]) -> list[dict]:
    """n consecutive, non-overlapping window diagnoses from one process on host `prefix` (the engine the CLI runs)."""
    argv = [*prefix, sys.executable, "-c", WINDOWS, str(job.dir / job.job_id), job.job_id, str(n), str(seconds)]
    env = dict(os.environ, HETOBS_DIR=str(job.dir))
    env.pop("HETOBS_SECRET", None)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    reports = json.loads(r.stdout)
    assert all(str(d["incident"]).startswith("ondemand-") for d in reports), reports
    return reports


def _crawl_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"READY": str(tmp_path / "ready-"), "STOP": str(tmp_path / "stop"), "HETOBS_HANG_TIMEOUT": "30", **extra}


def _judge_crawl(program: str, tmp_path: Path, slow_rank: int) -> tuple[int, dict]:
    """Run `program` on 3 ranks, `slow_rank` computing 3x longer; `--window 3` on it once it runs."""
    env = _crawl_env(tmp_path, COMPUTE_S="0.02", SLOW_RANK=str(slow_rank))
    with InlineJob(program, 3, tmp_path, env=env) as job:
        wait_until(lambda: all(os.path.exists(env["READY"] + str(r)) for r in range(3)), 60, "the ranks to run")
        time.sleep(3)  # let a full window of ops happen (the window is what is judged)
        rc, data = _window(job, 3)
        Path(env["STOP"]).touch()
        job.kill()
    return rc, data


@pytest.mark.slow
def test_window_names_the_rank_that_computes_three_times_longer_as_straggler(tmp_path: Path) -> None:
    rc, data = _judge_crawl(CRAWL, tmp_path, 1)
    assert rc == 0 and data["status"] == "healthy", data
    [v] = [v for v in data["verdicts"] if v["kind"] == "straggler"]
    assert v["ranks"] == [1], data["verdicts"]
    assert any("arrived last at" in e for e in v["evidence"]), v["evidence"]
    assert [x["kind"] for x in data["verdicts"]] == ["straggler"], data["verdicts"]


# The same crawl through torch.distributed on the "hetobs_gloo" backend: ops recorded by the
# torch wrapper (other backend, other communicator) are judged by the same window rule.
TORCH_CRAWL = """
import os, time, torch, torch.distributed as dist, hetobs
dist.init_process_group("hetobs_gloo")
rank = dist.get_rank()
compute_s = float(os.environ["COMPUTE_S"]) * (3 if str(rank) == os.environ["SLOW_RANK"] else 1)
x = torch.ones(16384)
i = 0
while not os.path.exists(os.environ["STOP"]):
    if i == 3:
        open(os.environ["READY"] + str(rank), "w").close()
    time.sleep(compute_s)  # stands for the step's compute, not for synchronization
    dist.all_reduce(x)
    i += 1
"""


@pytest.mark.slow
def test_window_names_the_slow_rank_of_a_torch_job_as_straggler(tmp_path: Path) -> None:
    rc, data = _judge_crawl(TORCH_CRAWL, tmp_path, 2)
    assert rc == 0 and data["status"] == "healthy", data
    assert [x["kind"] for x in data["verdicts"]] == ["straggler"], data["verdicts"]
    [v] = data["verdicts"]
    assert v["ranks"] == [2], v
    assert any("arrived last at" in e for e in v["evidence"]), v["evidence"]


@pytest.mark.slow
@needs_netns
def test_window_is_quiet_on_a_healthy_job_then_names_the_rate_limited_host_as_slow_link(tmp_path: Path) -> None:
    env = _crawl_env(tmp_path, COUNT=str(1 << 16))
    with Hosts(3) as hosts:
        with InlineJob(CRAWL, 3, tmp_path, env=env, transport="auto", master_addr=hosts.addrs[0],
                       prefix=[hosts.prefix(i) for i in range(3)]) as job:
            wait_until(lambda: all(os.path.exists(env["READY"] + str(r)) for r in range(3)), 60, "the ranks to run")
            healthy = _windows(job, 10, 1.5, hosts.prefix(0))
            rate_limit(hosts, 2, "20mbit")
            time.sleep(10)  # a whole window under the limit
            rc, slow = _window(job, 10, hosts.prefix(0))
            Path(env["STOP"]).touch()
            job.kill()
    assert len({data["incident"] for data in healthy} | {slow["incident"]}) == 11  # independent windows
    for data in healthy:
        assert data["status"] == "healthy" and data["verdicts"] == [], data
    assert rc == 0 and slow["status"] == "healthy", slow
    kinds = {v["kind"] for v in slow["verdicts"]}
    # The whole report on failure: its data problems and notes say whether a rank's dump was
    # missing (fewer measured pairs than the rule needs). Seen once in CI (2026-12-07, 1 of ~10
    # runs: no verdict at all), not reproduced alone.
    assert kinds == {"slow_link"}, slow
    assert all(2 in v["links"][0] for v in slow["verdicts"]), slow["verdicts"]
    assert all(v["ranks"] == [] for v in slow["verdicts"])


@pytest.mark.parametrize("args", [["--window", "0"], ["--window", "-3"], ["--window", "nan"],
                                  ["--window", "5", "--incident", "x"]])
def test_a_bad_window_is_one_line_usage_error(tmp_path: Path, args: list[str]) -> None:
    from typer.testing import CliRunner

    from hetobs.cli.main import app

    r = CliRunner().invoke(app, ["diagnose", "--job", "j1", "--dir", str(tmp_path), *args])
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "--window" in r.stderr and "Traceback" not in r.stderr + r.stdout, r.stderr


def test_link_health_series_are_capped_per_rank_to_its_worst_links() -> None:
    """A rank with many TCP links serves health series for LINK_HEALTH_SERIES_PER_RANK of them, the worst."""
    from hetobs import stats
    from hetobs.exporters.metrics import families
    from hetobs.exporters.naming import LINK_HEALTH_SERIES_PER_RANK
    from hetobs.exporters.source import RankEntry, Snapshot

    def link(peer: int) -> stats.LinkStats:
        tcp = dict.fromkeys(stats.HEALTH_FIELDS, 0)
        tcp.update(rtt_us=100 + peer, retransmits_total=peer % 7, sampled_ns=1)
        return stats.LinkStats(comm_id=0, peer=peer, global_peer=peer, transport="tcp", bytes_sent=0, bytes_recv=0,
                               frames_sent=0, frames_recv=0, busy_ns=0, last_activity_ns=0, progress={}, tcp=tcp)

    links = [link(p) for p in range(1, 41)]
    st = stats.RankStats(path="x", job="j", rank=0, world_size=41, pid=1, host="h", process_start_ticks=0,
                         hang_timeout_s=1.0, heartbeat_ns=1, last_progress_ns=1, hangs_detected=0, dumps_written=0,
                         exited_cleanly=False, process="alive", links=links)
    fams = {f.spec.name: f for f in families(Snapshot("j", 2, (RankEntry(0, "x", st),)))}
    rtt = fams["hetobs_link_rtt_seconds"].samples
    assert len(rtt) == LINK_HEALTH_SERIES_PER_RANK < len(links)
    worst = sorted(links, key=lambda ln: (ln.tcp["retransmits_total"], ln.tcp["rtt_us"]), reverse=True)
    assert {labels[3] for labels, _ in rtt} == {str(ln.global_peer) for ln in worst[:LINK_HEALTH_SERIES_PER_RANK]}
    assert len(fams["hetobs_link_bytes"].samples) == 2 * len(links)  # the plain counters are not capped here
