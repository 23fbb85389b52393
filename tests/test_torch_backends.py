"""torch.distributed through hetobs: the native "hetobs" backend and the instrumented
Gloo wrapper give exactly what plain Gloo gives (4 real ranks each), and the wrapper
records what it saw. The wrapper runs twice: as hetobs._torch_ext (the C++ c10d
backend torch dispatches to) and as the Python fallback (HETOBS_TORCH_NATIVE=0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _inline import InlineJob

pytest.importorskip("torch")

PROGRAM = Path(__file__).with_name("torch_program.py")
BODY = f"import runpy; runpy.run_path({str(PROGRAM)!r}, run_name='__main__')"


def run(backend: str, tmp_path: Path, env: dict[str, str] | None = None,
        lines_seen: list[dict[str, str]] | None = None) -> list[tuple[dict, list[dict] | None]]:
    with InlineJob(BODY, 4, tmp_path / backend, env={"TORCH_BACKEND": backend, **(env or {})}) as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    out = []
    for r in runs:
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("RESULT", "RECORDS",
                                                                                                "WRAPPER")))
        out.append((json.loads(lines["RESULT"]), json.loads(lines["RECORDS"]) if "RECORDS" in lines else None))
        if lines_seen is not None:
            lines_seen.append(lines)
    return out


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, list[dict] | None]]:
    return run("gloo", tmp_path_factory.mktemp("gloo"))


# What tests/torch_program.py runs on Gloo and the wrappers but not on the native backend.
WRAPPER_ONLY = {"gather", "scatter", "all_gather_coalesced_fast", "reduce_scatter_coalesced_fast",
                "all_reduce_coalesced_fast", "all_gather_coalesced", "batch_isend_irecv", "recv_anysource_from",
                "recv_anysource"}


def test_native_backend_matches_gloo(gloo, tmp_path: Path) -> None:
    ours = run("hetobs", tmp_path)
    for rank, ((g, _), (h, recs)) in enumerate(zip(gloo, ours)):
        assert h == {k: v for k, v in g.items() if k not in WRAPPER_ONLY}, f"rank {rank}"
        assert recs and {r["backend"] for r in recs} == {"native"}


@pytest.mark.parametrize("wrapper", ["native", "python"])
def test_gloo_wrapper_matches_gloo_and_records_every_op(gloo, tmp_path: Path, wrapper: str) -> None:
    seen: list[dict[str, str]] = []
    ours = run("hetobs_gloo", tmp_path, {"HETOBS_TORCH_NATIVE": "1" if wrapper == "native" else "0"}, seen)
    assert {lines["WRAPPER"] for lines in seen} == {wrapper}
    for rank, ((g, _), (h, recs)) in enumerate(zip(gloo, ours)):
        assert h == g, f"rank {rank}"
        wrapped = [r for r in recs if r["backend"] == "gloo"]
        ops = [r["op"] for r in wrapped]
        assert ops[:3] == ["all_reduce"] * 3 and "all_to_all" in ops and "barrier" in ops
        # send(), the isend ring and batch_isend_irecv; rank 3's send to rank 0's recv from any source.
        assert ops.count("send") == 2 + (rank == 0) + (rank == 3)
        assert ops.count("recv") == 2 + (rank == 1) + (rank == 0)
        assert {"gather", "scatter"} <= set(ops)
        first = wrapped[0]
        assert (first["count"], first["bytes"], first["state"]) == (10, 40, "completed")
        assert first["busbw_gbps"] > 0
        big = [r for r in wrapped if r["count"] == 300000]
        assert big and big[0]["bytes"] == 1_200_000 and big[0]["busbw_gbps"] > 0
        # Every record ended: also the all_reduce completed through its future alone.
        assert [r for r in wrapped if r["state"] != "completed"] == []
        group_ops = {r["comm_id"] for r in wrapped}
        assert len(group_ops) == (2 if rank in (0, 2) else 1)  # the world and new_group([0, 2])


def test_the_native_wrapper_is_built_for_this_torch() -> None:
    # The set-up installs torch before building hetobs, so hetobs._torch_ext must be there;
    # without it every wrapped op would silently cost ~20 us more.
    import torch

    from hetobs import _torch_ext
    from hetobs.torch import native_wrapper

    assert _torch_ext.TORCH_VERSION == torch.__version__
    assert native_wrapper() is _torch_ext


WRAP_BODY = """
import json, torch, torch.distributed as dist, hetobs
from hetobs.torch import wrap
dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
g = wrap(dist.group.WORLD)
x = torch.arange(4, dtype=torch.float32) + r
dist.all_reduce(x, group=g)
y = torch.empty(2 * n)
dist.all_gather_into_tensor(y, torch.full((2,), float(r)), group=g)
z = torch.full((3,), float(r))
dist.broadcast(z, src=1, group=g)
dist.barrier(group=g)
recs = [(v["op"], v["count"], v["state"], v["backend"]) for v in hetobs.records()]
print("OUT " + json.dumps({"x": x.tolist(), "y": y.tolist(), "z": z.tolist(), "recs": recs}), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("wrapper", ["native", "python"])
def test_wrap_instruments_an_existing_gloo_group(tmp_path: Path, wrapper: str) -> None:
    with InlineJob(WRAP_BODY, 2, tmp_path, env={"HETOBS_TORCH_NATIVE": "1" if wrapper == "native" else "0"}) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    for r in runs:
        out = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("OUT "))[4:])
        assert out["x"] == [1.0, 3.0, 5.0, 7.0]
        assert out["y"] == [0.0, 0.0, 1.0, 1.0]
        assert out["z"] == [1.0, 1.0, 1.0]
        assert [tuple(rec) for rec in out["recs"]] == [
            ("all_reduce", 4, "completed", "gloo"), ("all_gather", 2, "completed", "gloo"),
            ("broadcast", 3, "completed", "gloo"), ("barrier", 0, "completed", "gloo")]


NO_INLINE_WAIT_BODY = """
import json, time, torch, torch.distributed as dist, hetobs
from torch.distributed.distributed_c10d import _get_default_store
dist.init_process_group("hetobs_gloo")
store = _get_default_store()
if dist.get_rank() == 0:
    # Rank 1 joins only after "go": an all_reduce the wrapper waited on inline would never
    # return (what stalled DDP's backward at each bucket in the Python fallback).
    w = dist.all_reduce(torch.ones(4), async_op=True)
    pending, state = not w.is_completed(), hetobs.records()[-1]["state"]
    store.set("go", "1")
    w.wait()
    deadline = time.monotonic() + 10
    while hetobs.records()[-1]["state"] == "started" and time.monotonic() < deadline:
        time.sleep(0.001)  # the vendor future's callback ends the record just after wait() returns
    print("OUT " + json.dumps({"pending": pending, "in_flight": state, "after": hetobs.records()[-1]["state"]}),
          flush=True)
else:
    store.wait(["go"])
    dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("wrapper", ["native", "python"])
def test_an_async_op_returns_before_it_completes_and_its_record_ends_when_it_does(tmp_path: Path,
                                                                                    wrapper: str) -> None:
    with InlineJob(NO_INLINE_WAIT_BODY, 2, tmp_path,
                   env={"HETOBS_TORCH_NATIVE": "1" if wrapper == "native" else "0"}) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    out = json.loads(next(line for line in runs[0].stdout.splitlines() if line.startswith("OUT "))[4:])
    assert out == {"pending": True, "in_flight": "started", "after": "completed"}


# Counts every malloc-family call of the process (LD_PRELOAD), for the allocation test below.
ALLOC_COUNTER_C = r"""
#include <stddef.h>
#include <stdatomic.h>
extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);
static _Atomic long count;
static void counted(void) { atomic_fetch_add_explicit(&count, 1, memory_order_relaxed); }
void* malloc(size_t n) { counted(); return __libc_malloc(n); }
void* calloc(size_t a, size_t b) { counted(); return __libc_calloc(a, b); }
void* realloc(void* p, size_t n) { counted(); return __libc_realloc(p, n); }
int posix_memalign(void** out, size_t a, size_t n) {
  counted();
  *out = __libc_memalign(a, n);
  return *out ? 0 : 12;
}
long hetobs_test_allocations(void) { return atomic_load(&count); }
"""

ALLOC_BODY = """
import ctypes, json, torch, torch.distributed as dist, hetobs
from hetobs.torch import wrap
count = ctypes.CDLL(None).hetobs_test_allocations
count.restype = ctypes.c_long
dist.init_process_group("gloo")
g = wrap(dist.group.WORLD)
x, out = torch.ones(2), torch.empty(1)  # one rank: reduce_scatter of 1 element
ops = {"all_reduce": lambda grp: dist.all_reduce(x, group=grp),
       "reduce_scatter": lambda grp: dist.reduce_scatter_tensor(out, x[:1], group=grp)}
def per_op(op, grp, n=1000):
    for _ in range(200):
        ops[op](grp)
    before = count()
    for _ in range(n):
        ops[op](grp)
    return (count() - before) / n
added = {op: min(per_op(op, g) - per_op(op, dist.group.WORLD) for _ in range(3)) for op in ops}
print("OUT " + json.dumps(added), flush=True)
dist.destroy_process_group()
"""


def test_the_cpp_wrapper_allocates_nothing_per_op(tmp_path: Path) -> None:
    """Its Works come from a pool and its callback fits std::function's own storage. What is left
    is torch's: the vendor future's callback list grows by our callback when the op is still
    running (all_reduce, at most one allocation); Gloo's reduce_scatter has no future."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the allocation counter")
    src, lib = tmp_path / "count.c", tmp_path / "count.so"
    src.write_text(ALLOC_COUNTER_C)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=120)
    with InlineJob(ALLOC_BODY, 1, tmp_path, env={"LD_PRELOAD": str(lib), "HETOBS_TORCH_NATIVE": "1"}) as job:
        (run_,) = job.wait(120)
    assert run_.returncode == 0, run_.stderr[-3000:]
    added = json.loads(next(line for line in run_.stdout.splitlines() if line.startswith("OUT "))[4:])
    assert added["reduce_scatter"] < 0.05, added
    assert added["all_reduce"] < 1.05, added


ERROR_BODY = """
import torch, torch.distributed as dist, hetobs
dist.init_process_group("hetobs_gloo")
try:
    dist.all_gather_into_tensor(torch.empty(3), torch.ones(2))  # output must hold 2 * world
except Exception as e:
    print("RAISED", type(e).__name__, flush=True)
dist.all_reduce(torch.ones(2))  # the group still works
for v in hetobs.records():
    print("REC", v["op"], v["state"], flush=True)
dist.destroy_process_group()
"""


def test_a_vendor_error_reaches_the_caller_and_ends_the_record_as_failed(tmp_path: Path) -> None:
    with InlineJob(ERROR_BODY, 1, tmp_path) as job:
        (run_,) = job.wait(60)
    assert run_.returncode == 0, run_.stderr[-2000:]
    lines = run_.stdout.splitlines()
    assert any(line.startswith("RAISED") for line in lines), run_.stdout
    assert [line for line in lines if line.startswith("REC")] == ["REC all_gather failed", "REC all_reduce completed"]


DEVICE_PATH_BODY = """
import torch, torch.distributed as dist, hetobs
from hetobs.torch import wrap
dist.init_process_group("gloo")
# No GPU here: a Gloo group wrapped as if it were NCCL drives the device path, where no
# record ends from a future or an inline wait, only from the completion poller (which
# asks Work.is_completed(), as it asks the CUDA event of an NCCL op).
g = wrap(dist.group.WORLD, vendor="nccl")
works = [dist.all_reduce(torch.ones(1000) * i, group=g, async_op=True) for i in range(20)]
for w in works:
    w.get_future().wait()  # the vendor future: completes the op without touching our Work
del works
import time
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    states = [v["state"] for v in hetobs.records()]
    if states.count("completed") == 20:
        break
    time.sleep(0.01)  # polling for the poller's result, bounded by the deadline
print("STATES", sorted(set(states)), len(states), flush=True)
dist.destroy_process_group()
"""


def test_device_ops_are_finished_by_the_completion_poller(tmp_path: Path) -> None:
    with InlineJob(DEVICE_PATH_BODY, 2, tmp_path) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    for r in runs:
        assert "STATES ['completed'] 20" in r.stdout, r.stdout


def test_instrument_refuses_what_is_not_an_external_comm() -> None:
    import ctypes
    from datetime import timedelta

    import torch.distributed as dist

    from hetobs import _core, _torch_ext

    inner = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=5))
    with pytest.raises(TypeError):
        _torch_ext.instrument(inner, object(), "hetobs_gloo", False)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    foreign = new_capsule(ctypes.addressof(ctypes.c_int(0)), b"someone.else", None)
    with pytest.raises(TypeError, match="ExternalComm._hooks"):
        _torch_ext.instrument(inner, foreign, "hetobs_gloo", False)
    ext = _core.ExternalComm(99, [0], 0, 1, 0, "t")
    backend = _torch_ext.instrument(inner, ext._hooks(), "hetobs_gloo", False)
    assert backend.name() == "hetobs_gloo" and (backend.rank(), backend.size()) == (0, 1)


GROUP_API = """
import sys, hetobs, torch, torch.distributed as dist
dist.init_process_group(sys.argv[1], store=dist.HashStore(), rank=0, world_size=1)
g = dist.new_group([0])
print("FUTURE", g.allreduce([torch.ones(2)]).get_future().wait()[0].tolist())  # no options: torch's defaults
out = [[torch.zeros(2), torch.zeros(3)]]
dist.all_gather_coalesced(out, [torch.ones(2), torch.full((3,), 2.0)], group=g)
print("COALESCED", [t.tolist() for t in out[0]])
for name, call in (("anysource", lambda: dist.recv(torch.zeros(1))),
                   ("monitored", lambda: g.monitored_barrier()),
                   ("sparse", lambda: dist.all_reduce(torch.ones(2).to_sparse()))):
    try:
        call()
        print("NOERROR", name)
    except ValueError as e:
        print("REFUSED", name, e)
dist.destroy_process_group(g)  # a Python group keeps its own name: this once failed ("ProcessGroup name not set")
dist.destroy_process_group()
print("DESTROYED")
"""


@pytest.mark.parametrize("backend", ["hetobs", "hetobs_islands"])
def test_python_groups_take_direct_calls_coalesced_ops_and_refuse_clearly(tmp_path: Path, backend: str) -> None:
    env = {**os.environ, "HETOBS_DIR": str(tmp_path), "HETOBS_DEBUG": "ERROR"}
    run = subprocess.run([sys.executable, "-c", GROUP_API, backend], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[:2] == ["FUTURE [1.0, 1.0]", "COALESCED [[1.0, 1.0], [2.0, 2.0, 2.0]]"], run.stdout
    refused = {ln.split(" ", 2)[1]: ln.split(" ", 2)[2] for ln in lines if ln.startswith("REFUSED")}
    assert set(refused) == {"anysource", "monitored", "sparse"}, run.stdout
    assert "recv from any source is not supported" in refused["anysource"]
    assert "use barrier()" in refused["monitored"] and "dense tensors only" in refused["sparse"]
    assert lines[-1] == "DESTROYED"


DDP_BACKEND_NAME = """
import hetobs, torch, torch.distributed as dist
dist.init_process_group("hetobs_gloo", store=dist.HashStore(), rank=0, world_size=1)
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
ddp(torch.ones(1, 2)).sum().backward()
print("BACKEND", dist.get_backend(), ddp._get_ddp_logging_data()["backend_name"])
dist.destroy_process_group()
"""


def test_the_gloo_wrapper_names_itself_to_torch() -> None:
    """torch names a plugin's group "custom"; DDP's logging data and torch's messages read that."""
    run = subprocess.run([sys.executable, "-c", DDP_BACKEND_NAME], env={**os.environ, "HETOBS_DEBUG": "ERROR"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "BACKEND hetobs_gloo hetobs_gloo" in run.stdout.splitlines(), run.stdout


@pytest.mark.parametrize("imports", ["import hetobs", "import hetobs.torch", "import torch.distributed; import hetobs",
                                     "from hetobs.torch import wrap"])
def test_the_backends_are_registered_whatever_is_imported_first(imports: str) -> None:
    """`import hetobs.torch` first once left every hetobs backend unregistered: its own import of
    torch.distributed ran the registration hook while the package was half made."""
    code = f"{imports}\nimport torch.distributed as dist\nprint(sorted(dist.Backend._plugins))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "could not register" not in run.stderr, run.stderr[-2000:]
    assert run.stdout.split("\n")[0] == str(["HETOBS", "HETOBS_GLOO", "HETOBS_ISLANDS", "HETOBS_NCCL"]), run.stdout


MONITORED_ON_WRAPPED = """
import datetime, hetobs.torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
w = hetobs.torch.wrap(dist.group.WORLD)
dist.monitored_barrier(group=w, timeout=datetime.timedelta(seconds=30))
print("MONITORED", dist.get_backend(w))
"""


def test_a_wrapped_gloo_group_keeps_torchs_monitored_barrier() -> None:
    """torch refuses dist.monitored_barrier for every backend not named "gloo" (so for "hetobs_gloo");
    a Gloo group wrapped with hetobs.torch.wrap keeps its name and the barrier (docs/conformance.md)."""
    run = subprocess.run([sys.executable, "-c", MONITORED_ON_WRAPPED], env={**os.environ, "HETOBS_DEBUG": "ERROR"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "MONITORED gloo" in run.stdout.splitlines(), run.stdout
