"""all_reduce's, all_gather's and reduce_scatter's algorithm by payload, world size and transport
(docs/algorithms.md): over shared memory the direct path's crossover falls as HETOBS_SMALL_BYTES /
(n - 1), over TCP it stays at HETOBS_SMALL_BYTES; above it all_reduce on one host over shared memory
goes through the peers' memory (cma) where every rank may read and write every peer's, else the
ring; the ranks' records say which algorithm ran, and the results are exact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _inline import InlineJob

pytestmark = pytest.mark.slow

D, R, C = "direct", "ring", "cma"

BODY = r"""
import json, numpy as np, hetobs
comm = hetobs.init()
n, r = comm.size, comm.rank
bad = []
for nbytes in (16384, 32768, 65536, 65540):
    x = np.arange(nbytes // 4, dtype=np.float32) + r
    comm.all_reduce(x)
    want = np.arange(nbytes // 4, dtype=np.float32) * n + n * (n - 1) / 2
    if not np.array_equal(x, want):
        bad.append(nbytes)
algos = {}
for rec in comm.records():
    if rec.get("op") == "all_reduce":
        algos[str(rec["bytes"])] = rec["algorithm"]
print(json.dumps({"bad": bad, "algos": algos}))
comm.close()
"""

# world, transport -> algorithm at 16 KiB, 32 KiB, 64 KiB, 64 KiB + 4 (default HETOBS_SMALL_BYTES 65536);
# on one host over shared memory all_reduce goes through the peers' memory from 16 KiB (65536 / 4)
CASES = [
    (2, "shm", [D, C, C, C]),
    (3, "shm", [D, C, C, C]),
    (4, "shm", [D, C, C, C]),
    (4, "tcp", [D, D, D, R]),
]


@pytest.mark.parametrize("world,transport,want", CASES, ids=[f"w{w}-{t}" for w, t, _ in CASES])
def test_all_reduce_algorithm_by_size_world_and_transport(core: Any, tmp_path: Path, world: int, transport: str,
                                                          want: list[str]) -> None:
    with InlineJob(BODY, world, tmp_path, transport=transport) as job:
        runs = job.wait(90)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["bad"] == [], (r.rank, out)
        got = [out["algos"].get(str(b)) for b in (16384, 32768, 65536, 65540)]
        assert got == want, (world, transport, r.rank, out["algos"])


OTHERS_BODY = r"""
import json, numpy as np, hetobs
comm = hetobs.init()
n, r = comm.size, comm.rank
bad, algos = [], {}
for nbytes in (8, 4096, 32768, 32772, 65536, 65540):
    count = nbytes // 4
    x = np.arange(count, dtype=np.float32) + r
    out = np.zeros(count * n, np.float32)
    comm.all_gather(out, x)  # gathered size count * n * 4
    if not np.array_equal(out, np.concatenate([np.arange(count, dtype=np.float32) + p for p in range(n)])):
        bad.append(("all_gather", nbytes))
    lo, ln = (count // n) * r + min(r, count % n), count // n + (1 if r < count % n else 0)
    mine = np.zeros(ln, np.float32)
    comm.reduce_scatter(mine, x)
    if not np.array_equal(mine, (np.arange(count, dtype=np.float32) * n + n * (n - 1) / 2)[lo:lo + ln]):
        bad.append(("reduce_scatter", nbytes))
for rec in comm.records():
    if rec.get("op") in ("all_gather", "reduce_scatter"):
        algos.setdefault(rec["op"], {})[str(rec["bytes"])] = rec["algorithm"]
print(json.dumps({"bad": bad, "algos": algos}))
comm.close()
"""

SIZES = (8, 4096, 32768, 32772, 65536, 65540)
# world, transport, HETOBS_SMALL_BYTES -> {op: algorithm at each size of SIZES (the op's record bytes:
# all_gather's is the gathered size, world x the input)}
OTHER_CASES = [
    # direct to 65536 / (n - 1) on one host over shared memory, through the peers' memory above 65536
    (3, "shm", None, {"all_gather": [D, D, C, C, C, C], "reduce_scatter": [D, D, D, R, R, C]}),
    (4, "shm", None, {"all_gather": [D, D, C, C, C, C], "reduce_scatter": [D, D, R, R, R, C]}),
    (4, "tcp", None, {"all_gather": [D, D, R, R, R, R], "reduce_scatter": [D, D, D, D, D, R]}),
    (3, "shm", "0", {"all_gather": [R] * 6, "reduce_scatter": [R] * 6}),
]


@pytest.mark.parametrize("world,transport,small,want", OTHER_CASES,
                         ids=[f"w{w}-{t}{'-small=' + s if s else ''}" for w, t, s, _ in OTHER_CASES])
def test_small_all_gather_and_reduce_scatter_run_direct(core: Any, tmp_path: Path, world: int, transport: str,
                                                              small: str | None, want: dict[str, list[str]]) -> None:
    """all_gather (gathered size) and reduce_scatter (input size) up to HETOBS_SMALL_BYTES (divided
    by n-1 on one host over shared memory, as all_reduce) run the one-round direct algorithm, larger
    ones the ring, and HETOBS_SMALL_BYTES=0 forces it; the records say which ran, results are exact."""
    env = {"HETOBS_SMALL_BYTES": small} if small is not None else {}
    with InlineJob(OTHERS_BODY, world, tmp_path, transport=transport, env=env) as job:
        runs = job.wait(90)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["bad"] == [], (r.rank, out["bad"])
        for op, algs in want.items():
            sizes = [s * world if op == "all_gather" else s for s in SIZES]
            got = [out["algos"][op].get(str(s)) for s in sizes]
            assert got == algs, (op, world, transport, r.rank, out["algos"][op])


CMA_BODY = r"""
import json, numpy as np, hetobs
comm = hetobs.init()
n, r = comm.size, comm.rank
bad = []
for i in range(3):
    x = np.arange(1 << 18, dtype=np.float32) * (r + 1) + i
    comm.all_reduce(x)
    if not np.array_equal(x, np.arange(1 << 18, dtype=np.float32) * (n * (n + 1) / 2) + n * i):
        bad.append(i)
algos = [rec["algorithm"] for rec in comm.records() if rec.get("op") == "all_reduce"]
read = sum(l["single_copy_bytes"] for l in comm.links())
print(json.dumps({"bad": bad, "algos": algos, "read": read}))
comm.close()
"""


@pytest.mark.parametrize("world,case,want", [
    (2, "default", [C, C, C]),
    (3, "one-rank-may-not", [C, R, R]),  # the op that finds it out runs the ring under cma's name
    (2, "small=0", [R, R, R]),
], ids=lambda v: str(v) if not isinstance(v, list) else "")
def test_all_reduce_through_peers_memory_only_where_every_rank_may(core: Any, tmp_path: Path, world: int, case: str,
                                                                   want: list[str]) -> None:
    """1 MiB all_reduces: cma where every rank may read and write every peer's memory; one rank
    with single copy off (its links never read a peer) makes every rank take the ring, and
    HETOBS_SMALL_BYTES=0 forces it; exact either way."""
    off = {"HETOBS_SHM_SINGLE_COPY_BYTES": str(1 << 62)}
    env = {"HETOBS_SMALL_BYTES": "0"} if case == "small=0" else {}
    rank_env = {world - 1: off} if case == "one-rank-may-not" else {}
    with InlineJob(CMA_BODY, world, tmp_path, transport="shm", env=env, rank_env=rank_env) as job:
        runs = job.wait(90)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["bad"] == [] and out["algos"] == want, (case, r.rank, out)
        if case == "default":  # each rank read (n-1)/n of the 1 MiB per op from its peers
            assert out["read"] == 3 * (world - 1) * (1 << 20) // world, out


# Every rank's input and numpy's reduction of them, for the rank programs below (after n is set).
WANT_HELPERS = r"""
def part(p, count, dt, op):
    rng = np.random.default_rng(p * 1000 + count)
    return (rng.integers(-2, 3, count) if op == "prod" else rng.integers(-50, 50, count)).astype(dt)
def reduced(count, dt, op):
    fold = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    want = part(0, count, dt, op)
    for p in range(1, n):
        want = fold(want, part(p, count, dt, op))
    return (want / n).astype(dt) if op == "avg" else want
"""
DTYPES_AND_OPS = r"""
def dtypes_and_ops():
    for dt in ("int8", "uint8", "int32", "int64", "float16", "float32", "float64"):
        for op in ["sum", "prod", "min", "max"] + (["avg"] if dt.startswith("float") else []):
            yield dt, op
"""

EXACT_BODY = r"""
import json, numpy as np, hetobs
comm = hetobs.init()
n, r = comm.size, comm.rank
""" + WANT_HELPERS + DTYPES_AND_OPS + r"""
bad = []
# uneven blocks of several 256 KiB pieces, each with a remainder, and one just above direct's 16 KiB
for count in (300007, 16411):
    for dt, op in dtypes_and_ops():
        x = part(r, count, dt, op)
        comm.all_reduce(x, op=op)
        if x.tobytes() != reduced(count, dt, op).tobytes():
            bad.append((count, dt, op))
algos = sorted({rec["algorithm"] for rec in comm.records() if rec.get("op") == "all_reduce"})
print(json.dumps({"bad": bad, "algos": algos}))
comm.close()
"""


def test_cma_is_exact_for_every_dtype_and_reduction(core: Any, tmp_path: Path) -> None:
    """cma at 3 ranks, uneven blocks of several pieces (and one just above direct's sizes): every
    dtype and reduction equals numpy's over the three inputs, on every rank."""
    with InlineJob(EXACT_BODY, 3, tmp_path, transport="shm") as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["bad"] == [] and out["algos"] == ["cma"], (r.rank, out)


OTHERS_EXACT_BODY = r"""
import json, numpy as np, hetobs
comm = hetobs.init()
n, r = comm.size, comm.rank
""" + WANT_HELPERS + DTYPES_AND_OPS + r"""
bad = []
count = 300007  # uneven blocks of several 256 KiB pieces, each with a remainder
lo, ln = (count // n) * r + min(r, count % n), count // n + (1 if r < count % n else 0)
for dt, op in dtypes_and_ops():
    x, want = part(r, count, dt, op), reduced(count, dt, op)[lo:lo + ln]
    out = np.zeros(ln, dt)
    comm.reduce_scatter(out, x, op=op)
    if out.tobytes() != want.tobytes():
        bad.append(("reduce_scatter", dt, op))
    inplace = x.copy()  # the output is this rank's block of the input
    comm.reduce_scatter(inplace[lo:lo + ln], inplace, op=op)
    if inplace[lo:lo + ln].tobytes() != want.tobytes():
        bad.append(("reduce_scatter in place", dt, op))
    if op != "sum":
        continue
    block = count // n + 1
    mine = part(r, block, dt, op)
    gathered = np.zeros(block * n, dt)
    comm.all_gather(gathered, mine)
    if gathered.tobytes() != np.concatenate([part(p, block, dt, op) for p in range(n)]).tobytes():
        bad.append(("all_gather", dt))
    inplace = np.zeros(block * n, dt)
    inplace[r * block:(r + 1) * block] = mine
    comm.all_gather(inplace, inplace[r * block:(r + 1) * block])
    if inplace.tobytes() != gathered.tobytes():
        bad.append(("all_gather in place", dt))
algos = sorted({f'{rec["op"]}:{rec["algorithm"]}' for rec in comm.records()
                if rec.get("op") in ("all_gather", "reduce_scatter")})
print(json.dumps({"bad": bad, "algos": algos}))
comm.close()
"""


@pytest.mark.parametrize("case", ["default", "one-rank-may-not"])
def test_reduce_scatter_and_all_gather_through_peers_memory_are_exact(core: Any, tmp_path: Path, case: str) -> None:
    """reduce_scatter and all_gather at 3 ranks over uneven blocks of several pieces, in place and
    not: every dtype and reduction equals numpy's on every rank, through the peers' memory where
    every rank may read and write every peer's, else (one rank with single copy off) the ring."""
    rank_env = {2: {"HETOBS_SHM_SINGLE_COPY_BYTES": str(1 << 62)}} if case == "one-rank-may-not" else {}
    with InlineJob(OTHERS_EXACT_BODY, 3, tmp_path, transport="shm", rank_env=rank_env) as job:
        runs = job.wait(180)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    want = (["all_gather:cma", "reduce_scatter:cma"] if case == "default"
            else ["all_gather:ring", "reduce_scatter:cma", "reduce_scatter:ring"])  # the first op finds it out
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["bad"] == [] and out["algos"] == want, (case, r.rank, out)
