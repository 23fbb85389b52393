"""How many files a rank may open: the runtime raises RLIMIT_NOFILE to its hard limit at start
(a socket per peer breaks the default 1,024 near 1,000 ranks), and says once when that is low."""

from __future__ import annotations

from pathlib import Path

from _inline import InlineJob

LIMITS = """
import resource, hetobs
before = resource.getrlimit(resource.RLIMIT_NOFILE)
comm = hetobs.init()
after = resource.getrlimit(resource.RLIMIT_NOFILE)
print("LIMITS", *before, *after, flush=True)
"""


def _limits(run) -> list[int]:
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("LIMITS"))
    return [int(v) for v in line.split()[1:]]


def test_open_file_limit_is_raised_to_the_hard_limit_at_start(tmp_path: Path) -> None:
    with InlineJob(LIMITS, 2, tmp_path, transport="tcp", prefix=[["prlimit", "--nofile=256:4096", "--"]] * 2) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    for run in runs:
        assert _limits(run) == [256, 4096, 4096, 4096], run.stdout
        assert "open-file limit" not in run.stderr


def test_a_hard_limit_too_low_for_the_world_is_said_once(tmp_path: Path) -> None:
    with InlineJob(LIMITS, 2, tmp_path, transport="tcp", prefix=[["prlimit", "--nofile=100:200", "--"]] * 2) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    for run in runs:
        assert _limits(run) == [100, 200, 200, 200], run.stdout
        assert run.stderr.count("open-file limit 200 is low for 2 ranks") == 1, run.stderr


ON_DEMAND = """
import numpy as np, hetobs, json
comm = hetobs.init()
n, r = comm.size, comm.rank
def peers():
    return sorted(l["peer"] for l in comm.links())
seen = {"init": peers()}
x = np.ones(1 << 15, np.float32)  # 128 KiB: above HETOBS_SMALL_BYTES, so the ring
comm.all_reduce(x)
assert np.all(x == n)
seen["ring"] = peers()
half = n // 2  # rank r and r + half: not ring neighbours
comm.send(np.ones(4, np.float32), r + half) if r < half else comm.recv(np.empty(4, np.float32), r - half)
seen["p2p"] = peers()
out = np.empty(n * 4, np.float32)
comm.all_to_all(out, np.full(n * 4, r, np.float32))
assert list(out[::4]) == list(range(n)), out
seen["all_to_all"] = peers()
print("PEERS", json.dumps(seen), flush=True)
"""


def test_a_ring_op_connects_only_its_neighbours_and_all_to_all_the_rest(tmp_path: Path) -> None:
    import json

    world = 6
    with InlineJob(ON_DEMAND, world, tmp_path, transport="tcp") as job:
        runs = job.wait(90)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    for r, run in enumerate(runs):
        seen = json.loads(next(ln for ln in run.stdout.splitlines() if ln.startswith("PEERS"))[6:])
        ring = sorted({(r + 1) % world, (r - 1) % world})
        assert seen["init"] == [], seen
        assert seen["ring"] == ring, seen
        partner = (r + world // 2) % world
        assert seen["p2p"] == sorted(set(ring) | {partner}), seen
        assert seen["all_to_all"] == [p for p in range(world) if p != r], seen
