"""Faults that repeat (issue 28): bursts of TCP resets between two "hosts" (network namespaces),
4 ranks, 16 MiB all_reduces with every sum checked.

A reset is never a deliberate close: each burst breaks links, both ends re-make them, and the
ops resume exactly where they were. Real kernel faults: iptables REJECT --reject-with
tcp-reset on each host's interface, both directions at once. Needs root.

The ten-of-ten figure of the issue comes from running this file's burst test ten times in a row
(docs/reconnect.md says how); the suite runs it once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from _inline import InlineJob
from netns import NETNS_SKIP_REASON, RESET_RULE, Hosts, burst_results, reset_bursts

pytestmark = [pytest.mark.skipif(NETNS_SKIP_REASON is not None, reason=str(NETNS_SKIP_REASON)),
              pytest.mark.slow, pytest.mark.root]

WORLD = 4

# Each rank sums 16 MiB per op until the test creates STOP (agreed through a tiny all_reduce, so
# every rank runs the same number of ops); every element of every sum is checked.
LOOP = """
import os, sys, time, numpy as np, hetobs
stop = STOP
comm = hetobs.init()
w = comm.size
n = 4 << 20  # float32: 16 MiB
x = np.empty(n, np.float32)
flag = np.zeros(1, np.float32)
i = 0
try:
    while True:
        x[:] = comm.rank + 1 + i
        comm.all_reduce(x)
        want = w * (w + 1) // 2 + w * i
        assert np.all(x == want), (i, x[:4], want)
        if i == 0:
            print("STARTED", flush=True)
        flag[0] = float(os.path.exists(stop))
        comm.all_reduce(flag, op="max")
        i += 1
        if flag[0]:
            break
except hetobs.PeerError as e:
    print("FAILED", time.monotonic(), type(e).__name__, str(e).replace(chr(10), " "), flush=True)
    sys.exit(3)
print("OPS", i, flush=True)
print("LINKS", [l["reconnects"] for l in comm.links()], flush=True)
comm.close()
"""

TCP_ENV = {"HETOBS_TIMEOUT": "60", "HETOBS_CONNECT_TIMEOUT": "60", "HETOBS_HANG_TIMEOUT": "60"}


def _job(tmp_path: Path, hosts: Hosts, env: dict[str, str] | None = None) -> tuple[InlineJob, Path]:
    stop = tmp_path / "stop"
    body = LOOP.replace("STOP", repr(str(stop)))
    # Ranks 0, 1 on host 0 and 2, 3 on host 1: shared memory inside a host, TCP between them.
    prefix = [hosts.prefix(0), hosts.prefix(0), hosts.prefix(1), hosts.prefix(1)]
    job = InlineJob(body, WORLD, tmp_path, env={**TCP_ENV, **(env or {})}, transport="auto",
                    master_addr=hosts.addrs[0], prefix=prefix)
    return job, stop


def _job2(tmp_path: Path, hosts: Hosts, env: dict[str, str]) -> tuple[InlineJob, Path]:
    """The 16 MiB loop as two ranks, one per host: one TCP link between them."""
    stop = tmp_path / "stop"
    job = InlineJob(LOOP.replace("STOP", repr(str(stop))), 2, tmp_path, env={**TCP_ENV, **env}, transport="tcp",
                    master_addr=hosts.addrs[0], prefix=[hosts.prefix(0), hosts.prefix(1)])
    return job, stop


def dumps_of(job: InlineJob, rank: int) -> dict:
    """Rank `rank`'s dump of its failure: the two ends of a broken link may fail at neighbouring
    ops, each into its own error incident (the side channel is cut too)."""
    base = job.dir / job.job_id / "incidents"
    found = sorted(base.glob(f"error-*/rank-{rank}.json")) if base.exists() else []
    assert found, f"rank {rank} left no error dump under {base}"
    return json.loads(found[0].read_text())


def _started(job: InlineJob, timeout: float = 90.0) -> None:
    """Block until rank 0 printed STARTED (its first op completed)."""
    p = job.procs[0]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = p.stdout.readline()  # type: ignore[union-attr]
        if line.startswith("STARTED"):
            return
        if not line and p.poll() is not None:
            raise AssertionError(f"rank 0 exited before its first op: {p.stderr.read()[-3000:]}")  # type: ignore[union-attr]
    raise AssertionError(f"rank 0 did not start in {timeout} s")


def _logs(runs: list) -> list[str]:
    """Each rank's output, printed whole (a failing test shows captured output untruncated)
    and returned short for the assertion message."""
    for r in runs:
        print(f"===== rank {r.rank} rc {r.returncode}\n{r.stdout}\n{r.stderr}")
    return [f"rank {r.rank} rc {r.returncode}: {r.stdout[-300:]} {r.stderr[-600:]}" for r in runs]


def _reconnects(out: str) -> int:
    line = next(l for l in out.splitlines() if l.startswith("LINKS "))
    return sum(json.loads(line[len("LINKS "):]))


def test_three_reset_bursts_in_both_directions_are_survived_with_exact_sums(tmp_path: Path) -> None:
    with Hosts(2) as hosts:
        job, stop = _job(tmp_path, hosts)
        with job:
            _started(job)
            # Three bursts of 0.5 s, starting 2 s apart, on both hosts at once (both directions).
            bursts = [reset_bursts(hosts, h, count=3, seconds=0.5, gap=1.5) for h in (0, 1)]
            results = [burst_results(b) for b in bursts]
            stop.touch()
            runs = job.wait(120)
    why = _logs(runs)
    assert all(r.returncode == 0 for r in runs), (results, why)
    rejected = sum(n for per_host in results for n, _ in per_host)
    assert rejected > 0, ("the resets never hit the job's traffic", results)
    assert all(len(per_host) == 3 for per_host in results), results
    # Every op summed exactly (the ranks assert each element); the links really broke and were re-made.
    assert sum(_reconnects(r.stdout) for r in runs) > 0, why
    assert not any("closed its connection" in r.stdout + r.stderr for r in runs), why


# Rank 0 and rank 1 on two hosts: every byte crosses TCP. Each round: rank 0 sends, rank 1
# receives, then the other way (blocking p2p: a send returns once written, before the peer has
# it), then a relay both ways; every received byte is checked against what its sender made.
P2P = """
import os, sys, time, numpy as np, hetobs
stop = STOP
comm = hetobs.init()
peer = 1 - comm.rank
n = 2 << 20  # 2 MiB each way per message
def made(src, i):
    return (np.arange(n, dtype=np.uint64) * 2654435761 + src * 7919 + i).astype(np.uint8)
got = np.empty(n, np.uint8)
flag = np.zeros(1, np.float32)
i = 0
try:
    while True:
        out = made(comm.rank, i)
        if comm.rank == 0:
            comm.send(out, peer)
            comm.recv(got, peer)
        else:
            comm.recv(got, peer)
            comm.send(out, peer)
        assert np.array_equal(got, made(peer, i)), ("p2p", i)
        out2 = made(comm.rank, i + 1000000)
        comm.relay([(peer, out2)], [(peer, got)])
        assert np.array_equal(got, made(peer, i + 1000000)), ("relay", i)
        if i == 0:
            print("STARTED", flush=True)
        flag[0] = float(os.path.exists(stop))
        comm.all_reduce(flag, op="max")
        i += 1
        if flag[0]:
            break
except hetobs.PeerError as e:
    print("FAILED", time.monotonic(), type(e).__name__, str(e).replace(chr(10), " "), flush=True)
    sys.exit(3)
print("OPS", i, flush=True)
print("LINKS", [l["reconnects"] for l in comm.links()], flush=True)
comm.close()
"""


def test_p2p_sends_and_relays_resume_across_reset_bursts(tmp_path: Path) -> None:
    with Hosts(2) as hosts:
        stop = tmp_path / "stop"
        job = InlineJob(P2P.replace("STOP", repr(str(stop))), 2, tmp_path, env=TCP_ENV, transport="tcp",
                        master_addr=hosts.addrs[0], prefix=[hosts.prefix(0), hosts.prefix(1)])
        with job:
            _started(job)
            bursts = [reset_bursts(hosts, h, count=3, seconds=0.5, gap=1.5) for h in (0, 1)]
            results = [burst_results(b) for b in bursts]
            stop.touch()
            runs = job.wait(120)
    why = _logs(runs)
    assert all(r.returncode == 0 for r in runs), (results, why)
    assert sum(n for per_host in results for n, _ in per_host) > 0, ("the resets never hit the job", results)
    assert sum(_reconnects(r.stdout) for r in runs) > 0, why


def _diagnose(job: InlineJob) -> dict:
    from hetobs.diagnosis import Options, diagnose
    return json.loads(diagnose(Options(job_dir=job.dir / job.job_id)).to_json())


@pytest.mark.parametrize("hosts_resetting", [(1,), (0, 1)], ids=["one-direction", "both-directions"])
def test_a_link_that_cannot_be_remade_gets_the_link_verdict(tmp_path: Path, hosts_resetting: tuple[int, ...]) -> None:
    """Host 1 (or both hosts) resets every TCP segment from the other host for good. Each end
    fails naming the link; each end's dump holds the link's reconnect record (the break, the
    attempts, what they ended in); `diagnose` gives one transport_error verdict for the link,
    with its direction, and blames no rank: both processes were alive throughout."""
    with Hosts(2) as hosts:
        job, _ = _job2(tmp_path, hosts, {"HETOBS_RECONNECT_TIMEOUT": "3"})
        with job:
            _started(job)
            for h in hosts_resetting:
                hosts.run(h, "iptables", "-I", *RESET_RULE.split())
            runs = job.wait(90)
        report = _diagnose(job)
    why = _logs(runs)
    assert all(r.returncode == 3 for r in runs), why  # both failed with a PeerError, neither was killed
    ends = {r: dumps_of(job, r) for r in (0, 1)}
    for r, d in ends.items():
        link = next(l for c in d["comms"] for l in c["links"] if l["global_peer"] == 1 - r)
        rec = link["reconnect"]
        assert rec and rec["breaks"] >= 1 and rec["attempts"] >= 1 and rec["state"] in ("down", "closed"), (r, link)
        assert any(e["what"].startswith("broke") for e in rec["events"]), rec
        assert any(not e["what"].startswith("broke") for e in rec["events"]), rec  # an attempt's error
    faults = [v for v in report["verdicts"] if v["kind"] != "slow_link" and v["kind"] != "straggler"]
    assert [v["kind"] for v in faults] == ["transport_error"], report["verdicts"]
    v = faults[0]
    assert v["ranks"] == [], v
    # One host resetting: rank 0's attempts toward it are refused, so 0 -> 1 is the direction that
    # fails (rank 1's attempts toward rank 0 go unanswered: rank 0's answers die). Both hosts:
    # each end's attempts are refused, both directions.
    if hosts_resetting == (1,):
        assert [tuple(l) for l in v["links"]] == [(0, 1)], v
        assert "packets from rank 0 to rank 1" in v["summary"], v
    else:
        assert {tuple(l) for l in v["links"]} == {(0, 1), (1, 0)}, v
        assert "both directions" in v["summary"], v
