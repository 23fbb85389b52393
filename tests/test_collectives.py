"""Every collective x every dtype against a numpy reference, over real processes and sockets.

One job per (world size, transport) runs every op, dtype, size (0, 1, 7, 1001, 65540 and
~3 MiB), root and reduction, plus sub-communicators, async ops and torch tensors, in
sections (tests/rank_programs.py: prog_collectives). Each section is reported here as
its own test, so a failure names the op; the job itself is launched once per config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from _launch import Job, JobResult, shm_entries

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Config:
    world: int
    transport: str
    torch: bool = False
    env: tuple[tuple[str, str], ...] = ()
    sections: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        extra = "".join(f"-{k.removeprefix('HETOBS_').lower()}={v}" for k, v in self.env)
        return f"w{self.world}-{self.transport}{'-torch' if self.torch else ''}{extra}"


CONFIGS = [
    Config(1, "tcp", sections=("identity", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
                               "all_to_all", "barrier", "split", "new_group", "async")),
    Config(2, "tcp"),
    Config(2, "shm"),
    Config(3, "tcp", torch=True),
    Config(3, "shm", torch=True),
    Config(4, "tcp"),
    Config(4, "shm"),
    # every all_reduce on the ring path, even 1 element over 4 ranks (empty ring blocks)
    Config(4, "tcp", env=(("HETOBS_SMALL_BYTES", "0"),), sections=("all_reduce", "reduce_scatter", "split")),
    Config(3, "shm", env=(("HETOBS_SMALL_BYTES", "0"),), sections=("all_reduce", "reduce_scatter", "large")),
    # shared-memory single copy (the receiver reads the sender's buffer) at a low threshold, so the
    # sizes above fall on both sides of it; 3 ranks with every all_reduce on the ring
    *[Config(w, "shm", env=(("HETOBS_SHM_SINGLE_COPY_BYTES", t), *extra),
             sections=("all_reduce", "reduce_scatter", "all_gather", "broadcast", *more))
      for w, t, extra, more in [(2, "64", (), ()), (3, "64", (("HETOBS_SMALL_BYTES", "0"),), ("reduce",)),
                                (4, "4096", (), ("large",))]],
    # the pipelined TCP ring without reconnect: sends complete when written, nothing kept
    Config(3, "tcp", env=(("HETOBS_RECONNECT_TIMEOUT", "0"),), sections=("large",)),
]

SECTIONS = ["identity", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
            "barrier", "send_recv", "large", "split", "new_group", "async", "torch", "final"]


def _wanted(cfg: Config, section: str) -> bool:
    if section == "torch":
        return cfg.torch
    if section == "final":
        return True
    return not cfg.sections or section in cfg.sections


PAIRS = [pytest.param(cfg, sec, id=f"{cfg.id}-{sec}") for cfg in CONFIGS for sec in SECTIONS if _wanted(cfg, sec)]


@dataclass
class Run:
    config: Config
    job: Job
    result: JobResult
    shm_left: list[str] = field(default_factory=list)


def _launch(cfg: Config, workdir: Path) -> Run:
    shm0 = shm_entries()
    job = Job("collectives", cfg.world, {"seed": 1234 + cfg.world, "torch": cfg.torch,
                                         "sections": list(cfg.sections)},
              workdir=workdir, transport=cfg.transport, env=dict(cfg.env), deadline=240.0, gates=["async-hold"])
    try:
        job.start()
        res = job.wait()
    finally:
        job.close()
    return Run(cfg, job, res, job.shm_leftovers(shm0))


@pytest.fixture(scope="module")
def runs(core: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Config], Run]]:
    """One launch per config for the whole module, however pytest orders the tests."""
    cache: dict[Config, Run] = {}

    def get(cfg: Config) -> Run:
        if cfg not in cache:
            cache[cfg] = _launch(cfg, tmp_path_factory.mktemp(cfg.id))
        return cache[cfg]

    yield get
    cache.clear()


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.id for c in CONFIGS])
def test_job_exits_cleanly(runs: Callable[[Config], Run], cfg: Config) -> None:
    """Every rank exits 0 after close(), within the deadline, and leaves no /dev/shm entry."""
    run = runs(cfg)
    run.result.check()
    for r in run.result.ranks:
        assert r.result is not None and r.result.get("close_error") is None, run.result.describe()
    assert not run.shm_left, f"/dev/shm entries left by a cleanly finished job: {run.shm_left}"


@pytest.mark.parametrize("cfg,section", PAIRS)
def test_section(runs: Callable[[Config], Run], cfg: Config, section: str) -> None:
    run = runs(cfg)
    problems = []
    total_checks = 0
    for r in run.result.ranks:
        if r.result is None or "sections" not in r.result:
            pytest.fail(f"rank {r.rank} left no section results\n{run.result.describe()}")
        sec = r.result["sections"].get(section)
        if sec is None:
            problems.append(f"rank {r.rank}: section not run")
            continue
        if sec["skipped"]:
            problems.append(f"rank {r.rank}: {sec['skipped']}")
        if sec["error"]:
            e = sec["error"]
            problems.append(f"rank {r.rank}: raised {e['type']}: {e['msg']}\n{e.get('traceback', '')}")
        for f in sec["failures"]:
            problems.append(f"rank {r.rank}: {f}")
        total_checks += sec["checks"]
    assert not problems, f"{section} on {run.config.id}:\n" + "\n".join(problems)
    # a section that silently checked nothing must not pass (send_recv has no pairs on 1 rank)
    if not (section == "send_recv" and run.config.world == 1):
        assert total_checks > 0, f"{section} on {run.config.id} made no checks"


# -- the numpy fast path of all_reduce, the native loop, the wait policy -------------------

FAST_PATH_BODY = r"""
import json, numpy as np, hetobs
from hetobs.buffers import as_buffer
from hetobs.comm import OPS, REDUCTIONS
comm = hetobs.init()
native, R = comm._native, comm.rank
rng = np.random.default_rng(77 + R)
checked, bad = 0, []
def general(x, op):  # the path every all_reduce took before the fast path
    b = as_buffer(x, "x", writable=True)
    comm._run("all_reduce", b, b, redop=comm._reduction(op, b))
for dt in ("int8", "uint8", "int32", "int64", "longlong", "float16", "float32", "float64"):
    ops = ["sum", "prod", "min", "max"] + (["avg"] if dt.startswith("float") else [])
    for shape in [(0,), (1,), (2,), (7,), (1001,), (65540,), (6, 5), ()]:
        for op in ops:
            x = (rng.integers(-3, 4, size=shape) if op == "prod" else rng.integers(-100, 100, size=shape))
            x = np.asarray(x).astype(dt)
            fast, slow = x.copy(), x.copy()
            if native.all_reduce_inplace(fast, REDUCTIONS[op]) is not True:
                bad.append(f"fast path declined {dt} {shape} {op}")
            general(slow, op)
            if fast.tobytes() != slow.tobytes():
                bad.append(f"{dt} {shape} {op}: fast {fast.ravel()[:4]} != general {slow.ravel()[:4]}")
            checked += 1
# declined: left to the general path, which raises its usual errors
strided = np.zeros(8, np.float32)[::2]
ro = np.zeros(4, np.float32); ro.flags.writeable = False
declined = {"strided": native.all_reduce_inplace(strided, 0), "read-only": native.all_reduce_inplace(ro, 0),
            "big-endian": native.all_reduce_inplace(np.zeros(4, ">f4"), 0),
            "bool": native.all_reduce_inplace(np.zeros(4, bool), 0),
            "uint16": native.all_reduce_inplace(np.zeros(4, np.uint16), 0),
            "avg-int": native.all_reduce_inplace(np.zeros(4, np.int32), REDUCTIONS["avg"]),
            "list": native.all_reduce_inplace([1.0, 2.0], 0), "bytearray": native.all_reduce_inplace(bytearray(8), 0),
            "bad-redop": native.all_reduce_inplace(np.zeros(4, np.float32), 99)}
errors = {}
for name, x, op in (("strided", strided, "sum"), ("read-only", ro, "sum"), ("uint16", np.zeros(4, np.uint16), "sum"),
                    ("avg-int", np.zeros(4, np.int32), "avg"), ("list", [1.0], "sum"), ("bad-op", np.zeros(4, np.float32), "xor")):
    try:
        comm.all_reduce(x, op)
        errors[name] = None
    except ValueError as e:
        errors[name] = str(e)
# the native loop runs the same op back to back: ones doubled once per iteration at 2 ranks
x = np.ones(3, np.float64)
b = as_buffer(x, "x", writable=True)
ns = native.run_loop(OPS["all_reduce"], b.ptr, 3, b.ptr, 3, b.dtype, 0, 0, -1.0, 5)
print(json.dumps({"checked": checked, "bad": bad, "declined": declined, "errors": errors,
                  "loop": x.tolist(), "loop_ns": ns}))
comm.close()
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_all_reduce_fast_path_equals_general_path(core: Any, tmp_path: Path, transport: str) -> None:
    """comm.all_reduce on a numpy array takes the native fast path (all_reduce_inplace), whose
    results are bit-equal to the general path's for every dtype, shape and reduction; whatever it
    declines still gets the general path's clear errors; run_loop repeats the op natively."""
    import json

    from _inline import InlineJob

    with InlineJob(FAST_PATH_BODY, 2, tmp_path, transport=transport) as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["bad"] == [] and out["checked"] == 8 * 8 * 4 + 3 * 8, out["bad"][:10]
        assert not any(out["declined"].values()), out["declined"]
        errs = out["errors"]
        assert "not contiguous" in errs["strided"] and "read-only" in errs["read-only"]
        assert "unsupported dtype uint16" in errs["uint16"] and "floating dtype" in errs["avg-int"]
        assert "numpy array" in errs["list"] and "op='xor'" in errs["bad-op"]
        assert out["loop"] == [32.0] * 3 and out["loop_ns"] > 0


FAST_ENTRIES_BODY = r"""
import json, numpy as np, hetobs
from hetobs.buffers import as_buffer
from hetobs.comm import REDUCTIONS, _block
comm = hetobs.init()
native, R, n = comm._native, comm.rank, comm.size
rng = np.random.default_rng(5 + R)
ag, rs, bc = native.fast_entry("all_gather"), native.fast_entry("reduce_scatter"), native.fast_entry("broadcast")
checked, bad = 0, []
def general(name, send, recv, **kw):  # the path these ops took before their fast paths
    s = as_buffer(send, "x")
    r = as_buffer(recv, "out", writable=True) if recv is not None else s
    comm._run(name, s, r, **kw)
def data(dt, count, op="sum"):
    x = rng.integers(-3, 4, size=count) if op == "prod" else rng.integers(-100, 100, size=count)
    return np.asarray(x).astype(dt)
for dt in ("int8", "uint8", "int32", "int64", "longlong", "float16", "float32", "float64"):
    for count in (0, 1, 2, 7, 1001, 20000):  # 20000 x 8 B: above HETOBS_SMALL_BYTES, the ring
        x = data(dt, count)
        fast, slow = np.full(n * count, 9, dt), np.full(n * count, 9, dt)
        if ag(fast, x) is not True:
            bad.append(f"all_gather declined {dt} {count}")
        general("all_gather", x, slow)
        bad += [] if fast.tobytes() == slow.tobytes() else [f"all_gather {dt} {count}: {fast[:4]} != {slow[:4]}"]
        for op in ["sum", "prod", "min", "max"] + (["avg"] if dt.startswith("float") else []):
            x = data(dt, count, op)
            mine = _block(count, n, R)[1]
            fast, slow = np.full(mine, 9, dt), np.full(mine, 9, dt)
            if rs(fast, x, REDUCTIONS[op]) is not True:
                bad.append(f"reduce_scatter declined {dt} {count} {op}")
            general("reduce_scatter", x, slow, redop=REDUCTIONS[op])
            if fast.tobytes() != slow.tobytes():
                bad.append(f"reduce_scatter {dt} {count} {op}: {fast[:4]} != {slow[:4]}")
            checked += 1
        for root in range(n):
            fast = data(dt, count) if R == root else np.full(count, 9, dt)
            slow = fast.copy() if R == root else np.full(count, 7, dt)
            if bc(fast, root) is not True:
                bad.append(f"broadcast declined {dt} {count} root {root}")
            general("broadcast", slow, None, root=root)
            bad += [] if fast.tobytes() == slow.tobytes() else [f"broadcast {dt} {count} root {root}"]
        checked += 1
f32 = np.zeros(4, np.float32)
ro = np.zeros(4, np.float32); ro.flags.writeable = False
ro_out = np.zeros(4 * n, np.float32); ro_out.flags.writeable = False
ro_x = np.arange(4, dtype=np.float32); ro_x.flags.writeable = False
out_ro_ok = np.zeros(4 * n, np.float32)
read_only_input = ag(out_ro_ok, ro_x)  # only the output must be writable
bad += [] if read_only_input and np.array_equal(out_ro_ok, np.tile(np.arange(4, dtype=np.float32), n)) else ["ro input"]
declined = {
    "ag-strided": ag(np.zeros(8 * n, np.float32)[::2], f32), "ag-read-only-out": ag(ro_out, f32),
    "ag-dtypes": ag(np.zeros(4 * n, np.float64), f32), "ag-count": ag(np.zeros(4 * n + 1, np.float32), f32),
    "ag-list": ag([0.0] * 4 * n, f32), "ag-uint16": ag(np.zeros(4 * n, np.uint16), np.zeros(4, np.uint16)),
    "rs-count": rs(np.zeros(5, np.float32), np.zeros(4 * n, np.float32), 0),
    "rs-avg-int": rs(np.zeros(4, np.int32), np.zeros(4 * n, np.int32), REDUCTIONS["avg"]),
    "rs-bad-redop": rs(np.zeros(4, np.float32), np.zeros(4 * n, np.float32), 99),
    "rs-big-endian": rs(np.zeros(4, ">f4"), np.zeros(4 * n, ">f4"), 0),
    "bc-root-range": bc(f32, n), "bc-root-negative": bc(f32, -1), "bc-root-bool": bc(f32, True),
    "bc-root-numpy": bc(f32, np.int64(0)), "bc-read-only": bc(ro, 0), "bc-bytearray": bc(bytearray(8), 0),
}
errors = {}
cases = [("ag-dtypes", lambda: comm.all_gather(np.zeros(4 * n, np.float64), f32)),
         ("ag-count", lambda: comm.all_gather(np.zeros(4 * n + 1, np.float32), f32)),
         ("ag-read-only-out", lambda: comm.all_gather(ro_out, f32)),
         ("rs-count", lambda: comm.reduce_scatter(np.zeros(5, np.float32), np.zeros(4 * n, np.float32))),
         ("rs-avg-int", lambda: comm.reduce_scatter(np.zeros(4, np.int32), np.zeros(4 * n, np.int32), "avg")),
         ("rs-bad-op", lambda: comm.reduce_scatter(np.zeros(4, np.float32), np.zeros(4 * n, np.float32), "xor")),
         ("bc-root-range", lambda: comm.broadcast(f32, n)), ("bc-root-bool", lambda: comm.broadcast(f32, True)),
         ("bc-read-only", lambda: comm.broadcast(ro, 0)), ("bc-list", lambda: comm.broadcast([1.0], 0))]
for name, call in cases:
    try:
        call()
        errors[name] = None
    except ValueError as e:
        errors[name] = str(e)
comm.broadcast(f32, np.int64(0))  # a numpy integer root: declined by the fast path, run by the general one
print(json.dumps({"checked": checked, "bad": bad, "declined": declined, "errors": errors}))
comm.close()
"""


@pytest.mark.parametrize("world,transport", [(3, "shm"), (2, "tcp")], ids=["w3-shm", "w2-tcp"])
def test_fast_entries_equal_general_path_and_decline_what_it_explains(core: Any, tmp_path: Path, world: int,
                                                                      transport: str) -> None:
    """all_gather, reduce_scatter and broadcast on numpy arrays run through their fast entries
    (fast_entry: True when taken) with the general path's results for every dtype, size (odd
    blocks, empty, above the direct threshold), reduction and root; what they decline (strided,
    read-only output, mixed dtypes, wrong counts, bad reduction or root) returns False and the
    public call still raises the general path's error."""
    import json

    from _inline import InlineJob

    with InlineJob(FAST_ENTRIES_BODY, world, tmp_path, transport=transport) as job:
        runs = job.wait(150)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["bad"] == [] and out["checked"] == 6 * (5 * 4 + 3 * 5) + 6 * 8, (out["checked"], out["bad"][:10])
        assert not any(out["declined"].values()), out["declined"]
        e = out["errors"]
        assert "dtypes differ" in e["ag-dtypes"] and f"expected {world} x 4" in e["ag-count"], e
        assert "read-only" in e["ag-read-only-out"] and "read-only" in e["bc-read-only"], e
        assert "block of" in e["rs-count"] and "floating dtype" in e["rs-avg-int"] and "op='xor'" in e["rs-bad-op"], e
        assert "root=" in e["bc-root-range"] and "root=True" in e["bc-root-bool"] and "numpy array" in e["bc-list"], e


FRONTS_BODY = r"""
import gc, json, types, weakref, numpy as np, hetobs
gc.disable()  # the communicator must go by reference counting: the fronts make no cycle
comm = hetobs.init()
R, n = comm.rank, comm.size
fronted = {name: isinstance(getattr(comm, name), types.BuiltinFunctionType)
           for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast")}
x = np.full(5, R + 1.0, np.float32)
comm.all_reduce(x)                                     # the front itself
sums = [float(x[0])]
y = np.full(5, R + 1.0, np.float32)
comm.all_reduce(y, "max")                              # an op name: the general path
w = comm.all_reduce(np.full(3, 2.0), async_op=True)    # keywords: the general path
w.wait()
out = np.zeros(3 * n, np.float32)
comm.all_gather(out, np.full(3, float(R), np.float32))
rs = np.zeros(2, np.float64)
comm.reduce_scatter(rs, np.ones(2 * n))
b = np.full(4, float(R), np.float32)
comm.broadcast(b, n - 1)
b2 = np.full(4, float(R), np.float32)
comm.broadcast(b2)
errors = {}
for name, call in [("redop-number", lambda: comm.all_reduce(x, 0)), ("list", lambda: comm.all_reduce([1.0])),
                   ("root-range", lambda: comm.broadcast(b, n)), ("unknown-keyword", lambda: comm.all_reduce(x, bogus=1)),
                   ("too-many", lambda: comm.all_gather(out, x, 1, 2, 3))]:
    try:
        call()
        errors[name] = None
    except (ValueError, TypeError) as e:
        errors[name] = f"{type(e).__name__}: {e}"
front, ref = comm.all_reduce, weakref.ref(comm)
comm.close()
del comm
gone = ref() is None
after = {}
for name, arg in [("fast", x), ("general", [1.0])]:  # the native communicator is closed; the object gone
    try:
        front(arg)
        after[name] = None
    except Exception as e:
        after[name] = f"{type(e).__name__}: {e}"
print(json.dumps({"fronted": fronted, "sums": sums, "max": float(y[0]), "gather": out.tolist(), "rs": rs.tolist(),
                  "bcast": [float(b[0]), float(b2[0])], "errors": errors, "gone": gone, "after": after}))
"""


def test_public_methods_are_fronts_that_hand_other_calls_to_the_general_path(core: Any, tmp_path: Path) -> None:
    """A Communicator's all_reduce, all_gather, reduce_scatter and broadcast are C fronts
    (fast_front): the commonest call runs in C; an op name, keywords, bad arguments go to the
    Python method with its results and errors (an op given as a number is refused, not taken for
    sum); the front holds its communicator object weakly, so dropping it frees it without the
    cycle collector; a front kept past that raises the closed communicator's error, or
    ReferenceError where it needs the object."""
    import json

    from _inline import InlineJob

    with InlineJob(FRONTS_BODY, 2, tmp_path, transport="shm") as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for rank, r in enumerate(runs):
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert all(out["fronted"].values()), out["fronted"]
        assert out["sums"] == [3.0] and out["max"] == 2.0, out
        assert out["gather"] == [0.0] * 3 + [1.0] * 3 and out["rs"] == [2.0, 2.0] and out["bcast"] == [1.0, 0.0], out
        e = out["errors"]
        assert e["redop-number"].startswith("ValueError: op=0") and "numpy array" in e["list"], e
        assert e["root-range"].startswith("ValueError: root=2"), e
        assert e["unknown-keyword"].startswith("TypeError") and "bogus" in e["unknown-keyword"], e
        assert e["too-many"].startswith("TypeError"), e
        assert out["gone"] and out["after"]["fast"] == "HetobsError: communicator 0 is closed", out
        assert out["after"]["general"].startswith("ReferenceError") and "gone" in out["after"]["general"], out


POLICY_BODY = r"""
import json, numpy as np, hetobs
comm = hetobs.init()
x = np.full(4, comm.rank + 1.0)
comm.all_reduce(x)
print(json.dumps({"policy": comm._native.wait_policy(), "x": x.tolist()}))
comm.close()
"""


def test_wait_policy_yields_when_ranks_outnumber_cpus(core: Any, tmp_path: Path) -> None:
    """Four shm ranks sharing two CPUs are oversubscribed (waits yield instead of spinning); two
    ranks on those two CPUs are not, nor are two ranks each bound to a CPU of its own (as Open
    MPI binds them). Results are right every time."""
    import json
    import os
    import shutil

    from _inline import InlineJob

    cpus = sorted(os.sched_getaffinity(0))
    if not shutil.which("taskset") or len(cpus) < 2:
        pytest.skip("needs taskset (util-linux) and two CPUs")
    two = ",".join(map(str, cpus[:2]))
    cases = [("four-on-two", 4, [["taskset", "-c", two]] * 4, True),
             ("two-on-two", 2, [["taskset", "-c", two]] * 2, False),
             ("bound", 2, [["taskset", "-c", str(c)] for c in cpus[:2]], False)]
    for name, world, prefix, want in cases:
        with InlineJob(POLICY_BODY, world, tmp_path / name, prefix=prefix) as job:
            runs = job.wait(60)
        assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
        for r in runs:
            out = json.loads(r.stdout.strip().splitlines()[-1])
            assert out["policy"] == {"oversubscribed": want}, (name, out)
            assert out["x"] == [world * (world + 1) / 2] * 4
