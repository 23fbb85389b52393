"""Shared-memory single copy (transport/shm/single_copy.h): large collective messages are read
by the receiver straight out of the sender's buffer with process_vm_readv. Real ranks check
each result against numpy and report, per link, the bytes read that way; the kernel's refusal
(a non-dumpable rank without CAP_SYS_PTRACE) and the setting's "off" fall back to the ring; a
rank stopped while its peers wait inside the single-copy path is dumped and diagnosed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _inline import InlineJob
from test_watchdog import dumps, wait_for

pytestmark = pytest.mark.slow

THRESHOLD = "4096"
# element counts: under the threshold per ring block (7, 1001 at 4 bytes) and over it
SIZES = [7, 1001, 65540, 300001]
OFF = str(1 << 62)


def _failures(res: dict[str, Any]) -> list[str]:
    sec = res["sections"]["ops"]
    return ([f"raised {sec['error']['type']}: {sec['error']['msg']}"] if sec["error"] else []) + sec["failures"]


@pytest.mark.parametrize("world,mode", [(2, "on"), (4, "on"), (3, "off"), (2, "refused")])
def test_collectives_read_large_messages_from_the_peers_buffer(launcher: Any, leak_check: Any, world: int,
                                                               mode: str) -> None:
    env = {"HETOBS_SHM_SINGLE_COPY_BYTES": OFF if mode == "off" else THRESHOLD, "HETOBS_SMALL_BYTES": "0"}
    if mode == "refused":
        env["HETOBS_DEBUG"] = "DEBUG"
    job = launcher("single_copy", world, {"sizes": SIZES, "refuse": mode == "refused"}, transport="shm", env=env,
                   timeout=60.0)
    res = job.wait()
    results = res.check()
    for r in results:
        assert not _failures(r), (r["rank"], _failures(r))
        assert sorted(l["peer"] for l in r["links"]) == [p for p in range(world) if p != r["rank"]]
        # ring algorithms: this rank receives only from its left neighbour
        left = next(l for l in r["links"] if l["peer"] == (r["rank"] - 1) % world)
        assert left["transport"] == "shm" and left["bytes_recv"] > 0
        if mode == "on":
            # large blocks came in one copy, small ones still through the ring
            assert 0 < left["single_copy_bytes"] < left["bytes_recv"], left
        else:
            assert all(l["single_copy_bytes"] == 0 for l in r["links"]), r["links"]
    if mode == "refused":
        for rank in res.ranks:
            refusals = [ln for ln in rank.stderr.splitlines() if "no single copy" in ln]
            # logged once per process, with the kernel's reason
            assert len(refusals) == 1 and "Operation not permitted" in refusals[0], rank.stderr[-3000:]


STOPPED = """
import numpy as np, hetobs, os, signal, json
comm = hetobs.init()
x = np.ones(1 << 20, np.float32)
for i in range(6):
    if i == 4 and comm.rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    x[:] = comm.rank + 1
    comm.all_reduce(x)
    assert np.all(x == 6), x[:4]
print("LINKS", json.dumps(comm.links()), flush=True)
"""


@pytest.mark.parametrize("algorithm", ["ring", "cma"])
def test_rank_stopped_while_peers_wait_in_single_copy_is_dumped_and_named(tmp_path: Path, algorithm: str) -> None:
    """ring: the peers wait for rank 0 to read the buffers they named (HETOBS_SMALL_BYTES=0 forces
    it); cma: they wait for rank 0's buffer address before touching its memory. Either way the
    dumps and the diagnosis name rank 0 alone, and the job finishes once it runs again."""
    env = {"HETOBS_HANG_TIMEOUT": "1", "HETOBS_TIMEOUT": "60", "HETOBS_SHM_SINGLE_COPY_BYTES": THRESHOLD,
           **({"HETOBS_SMALL_BYTES": "0"} if algorithm == "ring" else {})}
    with InlineJob(STOPPED, 3, tmp_path, env=env) as job:
        rank0 = job.procs[0]
        os.waitpid(rank0.pid, os.WUNTRACED)  # returns once rank 0 is stopped
        inc = wait_for(lambda: (d := dumps(job).get("hang-c0-s5")) and len(d) == 2 and d, 20, "two dumps")
        assert sorted(inc) == [1, 2]
        for d in inc.values():
            flight = d["comms"][0]["in_flight"]
            assert flight["op"] == "all_reduce" and flight["collective_seq_id"] == 5, flight
            assert flight["algorithm"] == algorithm and 0 in {w["rank"] for w in flight["waiting_on"]}, flight
        if algorithm == "ring":
            # rank 2 named its block to rank 0 (its right) and waits for rank 0 to read it: over the
            # ring (two copies) that send would be done, the block sitting in rank 0's ring
            to0 = next(p for p in inc[2]["comms"][0]["in_flight"]["peers"] if p["peer"] == 0)["send"]
            assert to0["sent"] >= 1 and to0["acked"] == 0 and to0["done"] == 0, to0
        proc = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job.job_id, "--dir",
                               str(job.dir), "--json"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        faults = [v for v in json.loads(proc.stdout)["verdicts"] if v["kind"] not in ("straggler", "slow_link")]
        assert faults and {r for v in faults for r in v["ranks"]} == {0}, faults
        os.kill(rank0.pid, signal.SIGCONT)
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    for r in runs:
        links = json.loads(r.stdout.split("LINKS ", 1)[1])
        assert any(l["single_copy_bytes"] > 0 for l in links), links  # the ops above went the single-copy way


PUSH = """
import json, numpy as np, hetobs
comm = hetobs.init()
peer = 1 - comm.rank
# A point-to-point message from rank 1 waits unread in rank 0's ring while the broadcasts run:
# the receivers' answers to the push offers must not queue behind it.
if comm.rank == 1:
    comm.send(np.arange(3, dtype=np.int32), 0)
for n in BC_SIZES:
    want = (np.arange(n, dtype=np.int64) * 2654435761 + n).astype(np.uint8)
    x = want.copy() if comm.rank == 0 else np.zeros(n, np.uint8)
    comm.broadcast(x, 0)
    assert np.array_equal(x, want), (n, np.flatnonzero(x != want)[:5])
if comm.rank == 0:
    got = np.zeros(3, np.int32)
    comm.recv(got, 1)
    assert got.tolist() == [0, 1, 2], got
link = next(l for l in comm.links() if l["peer"] == peer)
bc = {k: link[k] for k in ("single_copy_bytes", "push_bytes")}
# all_gather: each rank writes its whole block into the other's output (out of place, and in
# place where the rank's input is its own slot of the output)
for n in AG_SIZES:
    want = np.concatenate([(np.arange(n, dtype=np.float64) + 0.5) * (r + 1) for r in range(2)])
    mine = (np.arange(n, dtype=np.float64) + 0.5) * (comm.rank + 1)
    out = np.zeros(2 * n)
    comm.all_gather(out, mine)
    assert np.array_equal(out, want), n
    inplace = np.zeros(2 * n)
    inplace[comm.rank * n:(comm.rank + 1) * n] = mine
    comm.all_gather(inplace, inplace[comm.rank * n:(comm.rank + 1) * n])
    assert np.array_equal(inplace, want), n
link = next(l for l in comm.links() if l["peer"] == peer)
ag = {k: link[k] - bc[k] for k in bc}
print("RESULT", json.dumps({"broadcast": bc, "all_gather": ag}), flush=True)
comm.close()
"""


def test_two_rank_broadcast_and_all_gather_push_into_the_receivers_buffer(tmp_path: Path) -> None:
    """Push (single_copy.h): from 256 KiB the root writes the second half of a 2-rank broadcast into
    the receiver's buffer while the receiver reads the first half out of the root's, and each
    rank of a 2-rank all_gather writes its block into the other's output; the links count
    exactly what was pushed and what arrived in one copy, and a message parked in the root's
    ring does not hold up the receiver's answer."""
    push_min = 256 * 1024
    sizes = [push_min - 1, push_min, 300001, (3 << 20) + 5, 40 << 20]  # broadcast, uint8
    ag_sizes = [push_min // 8 - 1, push_min // 8, 300001]  # float64 blocks: under, at and over push_min
    body = PUSH.replace("BC_SIZES", str(sizes)).replace("AG_SIZES", str(ag_sizes))
    with InlineJob(body, 2, tmp_path, env={"HETOBS_SHM_SINGLE_COPY_BYTES": THRESHOLD}) as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    got = [json.loads(r.stdout.split("RESULT ", 1)[1]) for r in runs]
    start = [(n // 2) & ~63 for n in sizes]  # shm::pushStart
    pushed = sum(n - s for n, s in zip(sizes, start) if n >= push_min)
    # rank 0 wrote the second halves into rank 1's buffer; everything reached rank 1 in one copy
    assert got[0]["broadcast"] == {"single_copy_bytes": 0, "push_bytes": pushed}, (got, pushed)
    assert got[1]["broadcast"] == {"single_copy_bytes": sum(sizes), "push_bytes": 0}, (got, sum(sizes))
    # all_gather, each size twice (out of and in place): blocks from push_min are written whole
    # by their owner, the one under it is read by the receiver; all arrive in one copy
    pushed_blocks = 2 * sum(8 * n for n in ag_sizes if 8 * n >= push_min)
    for r in (0, 1):
        assert got[r]["all_gather"] == {"single_copy_bytes": 2 * 8 * sum(ag_sizes), "push_bytes": pushed_blocks}, (
            r, got, pushed_blocks)
