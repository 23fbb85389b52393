"""Job-wide dump requests spread down a tree of side channels (csrc/src/observe/dump_tree.cc).

The simulation runs the runtime's own chunking and take-over code (hetobs._core.simulate_dump_spread),
round by round without a network; the real-process tests run it over real side channels.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import time
from pathlib import Path

import pytest

from _inline import InlineJob
from hetobs.diagnosis import Options, diagnose
from hetobs.stats import RankStats, read_segment, segment_paths
from test_watchdog import dumps, wait_for


def _dead(n: int, fraction: float, origin: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return rng.sample([r for r in range(n) if r != origin], int(n * fraction))


@pytest.mark.parametrize("n,origin", [(65_536, 0), (65_536, 40_961), (1_048_576, 777_777)])
def test_simulated_spread_with_one_percent_dead_reaches_every_live_rank(core, n: int, origin: int) -> None:
    dead = _dead(n, 0.01, origin, seed=14)
    sim = core.simulate_dump_spread(n, dead, origin)
    assert sim["reached"] == n - len(dead), sim
    assert sim["duplicates"] == 0, sim
    assert sim["rounds"] <= 2 * math.log2(n), sim
    assert sim["messages"] <= 3 * n, sim


def test_simulated_dead_head_of_the_largest_chunk_is_taken_over(core) -> None:
    n = 4_096
    # Position 1 heads the first quarter of the world; with it and its first two successors
    # dead, their chunks are handed on by the ranks that asked them.
    sim = core.simulate_dump_spread(n, [1, 2, 3])
    assert sim["reached"] == n - 3 and sim["duplicates"] == 0, sim
    assert sim["messages"] == n - 1, sim  # every other rank asked exactly once, dead or not


def test_chunks_cover_the_rest_of_an_interval_without_overlap(core) -> None:
    for lo, hi in [(0, 1), (0, 2), (0, 8), (5, 6), (3, 1000), (0, 65_536)]:
        chunks = core.dump_spread_chunks(lo, hi)
        assert len(chunks) <= 4
        covered = [p for a, b in chunks for p in range(a, b)]
        assert covered == list(range(lo + 1, hi)), (lo, hi, chunks)


IDLE = """
import hetobs, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})  # before hetobs's threads: all inherit it
comm = hetobs.init()
signal.sigwait({signal.SIGUSR2})  # until the test lets it go
"""


def _side_channel(job: InlineJob, rank: int) -> tuple[str, int] | None:
    path = job.dir / job.job_id / "ranks" / f"rank-{rank}.json"
    try:
        sc = json.loads(path.read_text())["side_channel"]
    except (OSError, ValueError, KeyError):
        return None
    return (sc["ip"], sc["port"]) if sc.get("port") else None


def test_stopped_head_its_chunk_is_taken_over_and_every_live_rank_dumps_once(core, tmp_path: Path) -> None:
    world = 8
    env = {"HETOBS_HANG_TIMEOUT": "inf"}
    with InlineJob(IDLE, world, tmp_path, env=env, transport="tcp") as job:
        try:
            addrs = wait_for(lambda: (a := [_side_channel(job, r) for r in range(world)]) and all(a) and a, 60,
                             "every rank's side channel")
            os.kill(job.procs[1].pid, signal.SIGSTOP)  # heads [1, 3) of rank 0's spread
            os.waitpid(job.procs[1].pid, os.WUNTRACED)
            ip, port = addrs[0]
            asked = time.time_ns()
            request = f"spread\ntree-1\npeer_request\n5\n0\n0\n{world}\n{asked}\nthe test asked"
            assert core.side_channel_request(ip, port, job.job_id, "", request, 5.0).startswith("ok")
            inc = wait_for(lambda: (d := dumps(job).get("tree-1")) and len(d) == world - 1 and d, 20,
                           "seven dumps")
            # Asked again, by a spread of a higher origin: rank 3 dumped the incident already.
            again = f"spread\ntree-1\npeer_request\n5\n3\n0\n{world}\n{asked}\nthe test asked again"
            assert core.side_channel_request(*addrs[3], job.job_id, "", again, 5.0).startswith("ok")
        finally:
            os.kill(job.procs[1].pid, signal.SIGCONT)
            for p in job.procs:
                os.kill(p.pid, signal.SIGUSR2)
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    inc = dumps(job)["tree-1"]
    assert sorted(inc) == [0, 2, 3, 4, 5, 6, 7]
    root = inc[0]["spread"]
    assert root["origin"] == 0 and root["from"] == 5 and root["interval"] == [0, world]
    assert root["asked_ns"] == asked and root["received_ns"] >= asked
    # Rank 0 asked the four chunk heads, then, rank 1 not answering, rank 2 in its place.
    assert inc[0]["side_channel"]["unanswered"] == [1]
    assert sorted(inc[0]["side_channel"]["asked"]) == [1, 2, 3, 5, 7]
    assert inc[3]["spread"]["origin"] == 0  # its one dump is the first request's
    assert inc[2]["spread"]["from"] == 0 and inc[2]["spread"]["interval"] == [2, 3]
    assert inc[4]["spread"]["from"] == 3 and inc[6]["spread"]["from"] == 5
    assert sum(d["spread"]["requests_sent"] for d in inc.values()) == world - 1
    assert all(d["reason"] == "peer_request" and d["spread"]["received_ns"] > 0 for d in inc.values())


SLEEPER = """
import numpy as np, hetobs, os, time
def computing_elsewhere():
    time.sleep(4)
comm = hetobs.init()
x = np.ones(64, np.float32)
for i in range(6):
    if i == 3 and comm.rank == 5:
        computing_elsewhere()
    comm.all_reduce(x)
"""


@pytest.mark.slow
def test_sixteen_ranks_one_hangs_all_dump_through_the_tree_with_at_most_3n_requests(tmp_path: Path) -> None:
    world = 16
    env = {"HETOBS_HANG_TIMEOUT": "1", "HETOBS_TIMEOUT": "30"}
    with InlineJob(SLEEPER, world, tmp_path, env=env, transport="tcp") as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    incidents = dumps(job)
    assert list(incidents) == ["hang-c0-s4"], incidents.keys()
    inc = incidents["hang-c0-s4"]
    assert sorted(inc) == list(range(world))
    times = [d["time_ns"] for d in inc.values()]
    assert max(times) - min(times) <= 2e9, "every live rank dumps within 2 s of the first"
    requests = sum(d["spread"]["requests_sent"] for d in inc.values())
    assert requests <= 3 * world, requests
    origins = {d["spread"]["origin"] for d in inc.values()}
    for d in inc.values():
        s = d["spread"]
        if s["from"] is None:  # started the spread itself: its watchdog fired
            assert d["reason"] == "watchdog" and s["origin"] == d["rank"] and s["interval"] == [0, world]
        else:  # the asker's dump lists it
            assert d["rank"] in inc[s["from"]]["side_channel"]["asked"] or len(origins) > 1
            assert s["asked_ns"] <= s["received_ns"] + 1_000_000_000  # two clocks of one host
    assert inc[5]["reason"] == "peer_request"


HELD = """
import numpy as np, hetobs, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})  # before hetobs's threads: all inherit it
comm = hetobs.init()
x = np.ones(64, np.float32)
for i in range(5):
    if i == 3 and comm.rank == 6:
        signal.sigwait({signal.SIGUSR2})  # computing elsewhere until the test lets it go
    comm.all_reduce(x)
"""


def _segments(job: InlineJob, ranks: list[int]) -> dict[int, RankStats] | None:
    got = {}
    for path in segment_paths(job.job_id):
        try:
            s = read_segment(path, records=8)
        except (OSError, ValueError):
            return None
        got[s.rank] = s
    return {r: got[r] for r in ranks} if all(r in got for r in ranks) else None


def _waiting_in_seq(stats: dict[int, RankStats] | None, seq: int) -> bool:
    return stats is not None and all(
        any(r["collective_seq_id"] == seq and r["state"] in ("enqueued", "started") for r in s.records)
        for s in stats.values())


@pytest.mark.slow
@pytest.mark.parametrize("coordinator", ["live", "stopped"])
def test_watchdogs_firing_together_join_one_spread(tmp_path: Path, coordinator: str) -> None:
    """Nine ranks wait on rank 6; all are stopped past the hang timeout and let go at once, so
    their watchdogs fire together. They join one spread instead of each starting one: rank
    0's, or, with rank 0 left stopped, rank 1's (the next coordinator)."""
    world, hung, timeout = 10, 6, 3.0
    waiting = [r for r in range(world) if r != hung]
    resumed = waiting if coordinator == "live" else waiting[1:]
    head = resumed[0]
    env = {"HETOBS_HANG_TIMEOUT": str(timeout), "HETOBS_TIMEOUT": "60"}
    with InlineJob(HELD, world, tmp_path, env=env, transport="tcp") as job:
        stopped: list[int] = []
        try:
            wait_for(lambda: _waiting_in_seq(_segments(job, waiting), 4), 60, "nine ranks waiting in seq 4")
            for r in waiting:
                os.kill(job.procs[r].pid, signal.SIGSTOP)
                stopped.append(r)
                os.waitpid(job.procs[r].pid, os.WUNTRACED)
            stats = _segments(job, waiting)
            assert stats is not None
            early = [r for r in waiting if stats[r].hangs_detected]
            # Stopped, their clocks run on: let them go once every one is past the hang timeout.
            past = max(stats[r].last_progress_ns for r in waiting) + int(timeout * 1e9) + 200_000_000
            time.sleep(max(0.0, (past - time.time_ns()) / 1e9))
            for r in resumed:
                os.kill(job.procs[r].pid, signal.SIGCONT)
                stopped.remove(r)
            want = world - len(stopped)
            inc = wait_for(lambda: (d := dumps(job).get("hang-c0-s4")) and len(d) == want and d, 30, f"{want} dumps")
            fired = [r for r, s in (_segments(job, resumed) or {}).items() if s.hangs_detected]
            report = diagnose(Options(job_dir=job.dir / job.job_id, incident="hang-c0-s4"))
        finally:
            for r in stopped:
                os.kill(job.procs[r].pid, signal.SIGCONT)
            os.kill(job.procs[hung].pid, signal.SIGUSR2)
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert not early, f"ranks {early} saw the hang before they were stopped: not a test of firing together"
    assert len(fired) >= 3, f"only ranks {fired} saw the hang themselves"
    assert sorted(inc) == sorted([*resumed, hung])
    origins = sorted(d["rank"] for d in inc.values() if d["spread"]["origin"] == d["rank"])
    assert origins == [head], f"spreads started by {origins}"
    requests = sum(d["spread"]["requests_sent"] for d in inc.values())
    assert requests <= 3 * world, requests
    # A rank the spread reached before its watchdog fired dumped at the request (peer_request);
    # one whose watchdog fired first says what it saw, and who asked it and when.
    saw = [r for r, d in inc.items() if d["hang_detected_ns"] is not None]
    assert saw and set(saw) <= set(fired), (saw, fired)
    for r in saw:
        d = inc[r]
        assert d["reason"] == "watchdog" and f"rank {hung}" in d["cause"], d["cause"]
        sc = d["side_channel"]
        # It asked rank 0 first, unless the spread had reached it already (then it asked no
        # coordinator and joined that spread).
        asks = sc["coordinators_asked"]
        assert sc["asked"][: len(asks)] == asks and (asks[:1] == [0] or not asks), sc
        if r != 0 and not asks:
            assert d["spread"]["from"] is not None, d["spread"]
        if r != head:
            s = d["spread"]
            assert s["origin"] == head and s["from"] is not None and s["asked_ns"] > 0, s
    root = inc[head]["spread"]
    # A spread nobody asked for is the head's own watchdog's. The head may have seen the hang
    # and still be asked first: its watchdog and another rank's request race when all fire
    # together, and either starts the one spread.
    assert root["interval"] == [0, world] and (root["from"] is not None or head in saw), root
    assert inc[hung]["reason"] == "peer_request" and inc[hung]["hang_detected_ns"] is None
    if coordinator == "stopped":  # rank 0 answered nobody, and was asked at most once by each
        assert all(0 not in d["side_channel"]["answered"] for d in inc.values())
        assert all(d["side_channel"]["asked"].count(0) <= 1 for d in inc.values())
    faults = [(v.kind.value, v.ranks) for v in report.verdicts if v.kind.is_fault]
    if coordinator == "live":
        assert faults and faults[0] == ("rank_not_joined", [hung]), faults
    else:  # two culprits, each named: rank 0 stopped, rank 6 elsewhere
        assert ("rank_unresponsive", [0]) in faults and ("rank_not_joined", [hung]) in faults, faults


def test_coordinator_starts_one_spread_however_often_asked_and_refuses_bad_start_requests(core, tmp_path: Path) -> None:
    world = 6
    with InlineJob(IDLE, world, tmp_path, env={"HETOBS_HANG_TIMEOUT": "inf"}, transport="tcp") as job:
        try:
            addrs = wait_for(lambda: (a := [_side_channel(job, r) for r in range(world)]) and all(a) and a, 60,
                             "every rank's side channel")
            ask = lambda text: core.side_channel_request(*addrs[0], job.job_id, "", text, 5.0)  # noqa: E731
            for bad, why in [("start\nx-1\npeer_request\n3\n", "malformed start request"),
                             (f"start\nx-1\npeer_request\n{world}\n1\nc", "bad requesting rank"),
                             ("start\nx-1\npeer_request\n3\n-5\nc", "bad asked_ns"),
                             ("start\n../x\npeer_request\n3\n1\nc", "bad incident id"),
                             ("start\nx-1\nwatchdog\n3\n1\nc", "bad reason")]:
                assert ask(bad) == f"error {why}", bad
            asked = time.time_ns()
            for frm in (3, 4, 3):  # three watchdogs asking: one spread
                assert ask(f"start\njoin-1\npeer_request\n{frm}\n{asked}\nwaiting on rank 5").startswith("ok")
            inc = wait_for(lambda: (d := dumps(job).get("join-1")) and len(d) == world and d, 20, "six dumps")
        finally:
            for p in job.procs:
                os.kill(p.pid, signal.SIGUSR2)
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    root = inc[0]["spread"]
    assert root["origin"] == 0 and root["from"] == 3 and root["asked_ns"] == asked and inc[0]["requested_by"] == 3
    assert {d["spread"]["origin"] for d in inc.values()} == {0}
    assert sum(d["spread"]["requests_sent"] for d in inc.values()) == world - 1
    assert list(dumps(job)) == ["join-1"]  # the refused requests dumped nothing
