"""Rank-side programs for the multi-process tests.

Run by tests/_launch.py as ``python tests/rank_programs.py <program> <json-args>`` with
RANK/WORLD_SIZE/MASTER_* and HETOBS_* in the environment. A program returns a JSON-able
dict, which is written atomically to $HETOBS_TEST_RESULT; an exception escaping it is
written there too (exit status 1). Progress events go to the pipe $HETOBS_TEST_EVENT_FD.

Inputs are built deterministically from (seed, case, rank), so every rank can compute
every other rank's input and so the numpy reference for the whole collective locally.
Float inputs of reductions are small integers, so sums and products are exact whatever
the order of reduction; integer types use their full range and the reference reduces in
that same dtype (wrap-around included, which is order-independent).
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import re
import sys
import time
import traceback
import zlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

try:
    import ml_dtypes

    BF16: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml-dtypes is a test dependency
    BF16 = None

DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
FLOATS = {"float16", "bfloat16", "float32", "float64"}
REDUCTIONS = ["sum", "prod", "min", "max", "avg"]
SIZES = [0, 1, 7, 1001, 65537 + 3]
LARGE_BYTES = 3 * 1024 * 1024 + 24  # ~3 MiB: the ring / pipelined path


# ----------------------------------------------------------------------------------------------
# process plumbing
# ----------------------------------------------------------------------------------------------
class Ctx:
    def __init__(self) -> None:
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.job_id = os.environ.get("HETOBS_JOB_ID", "")
        self.gates = os.environ.get("HETOBS_TEST_GATES", "")
        fd = os.environ.get("HETOBS_TEST_EVENT_FD")
        self.event_fd = int(fd) if fd else None

    def event(self, name: str, **data: Any) -> None:
        """Tell the test something (JSON line on the event pipe)."""
        if self.event_fd is None:
            return
        line = json.dumps({"event": name, "rank": self.rank, "t": time.monotonic(), **data}) + "\n"
        os.write(self.event_fd, line.encode())

    def gate_wait(self, name: str) -> None:
        """Block until someone opens gate `name` (a FIFO the launcher made)."""
        with open(os.path.join(self.gates, name), "rb") as f:
            f.read()

    def gate_open(self, name: str) -> None:
        """Release whoever waits at gate `name` (blocks until a reader is there)."""
        with open(os.path.join(self.gates, name), "wb") as f:
            f.write(b"go\n")

    def init(self) -> Any:
        import hetobs

        return hetobs.init()


def exc_info(e: BaseException) -> dict[str, Any]:
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e),
            "t": time.monotonic()}


def comm_address(comm: Any) -> tuple[list[Any], str]:
    """(host, port) of a rank's listener. The brief's API is `comm.address`; fall back to the
    native object if the Python façade lacks it (reported by the test)."""
    if hasattr(type(comm), "address") or "address" in getattr(comm, "__dict__", {}):
        a = comm.address
        return list(a() if callable(a) else a), "Communicator.address"
    a = comm._native.address
    return list(a() if callable(a) else a), "Communicator._native.address"


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def shm_mine(job_id: str) -> list[str]:
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return []
    pid = str(os.getpid())
    return sorted(n for n in names if job_id in n or re.search(rf"(?<!\d){pid}(?!\d)", n))


# ----------------------------------------------------------------------------------------------
# data and references
# ----------------------------------------------------------------------------------------------
def np_dtype(name: str) -> Any:
    if name == "bfloat16":
        if BF16 is None:
            raise RuntimeError("ml_dtypes is needed for bfloat16")
        return BF16
    return np.dtype(name)


def tag_of(*parts: Any) -> int:
    return zlib.crc32(repr(parts).encode())


def make(seed: int, tag: int, rank: int, n: int, dtname: str, kind: str = "any") -> np.ndarray:
    """Rank `rank`'s input of case `tag`. kind: any (copy ops), sum/avg, prod, min/max."""
    rng = np.random.default_rng([seed & 0xFFFFFFFF, tag & 0xFFFFFFFF, rank])
    dt = np_dtype(dtname)
    if dtname not in FLOATS:
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dt)
    if kind in ("sum", "avg"):
        return rng.integers(-8, 9, size=n).astype(np.float64).astype(dt)
    if kind == "prod":
        return (rng.choice(np.array([-2.0, -1.0, 1.0, 2.0]), size=n)).astype(dt)
    # any / min / max: arbitrary (finite) values; copies and min/max are exact for all of them
    return (rng.standard_normal(n) * 100.0).astype(dt)


def ref_reduce(stack: np.ndarray, op: str, dtname: str) -> np.ndarray:
    dt = np_dtype(dtname)
    if dtname in FLOATS:
        s = stack.astype(np.float64)
        if op == "sum":
            r = s.sum(axis=0)
        elif op == "prod":
            r = s.prod(axis=0)
        elif op == "min":
            r = s.min(axis=0) if len(s) else s
        elif op == "max":
            r = s.max(axis=0) if len(s) else s
        elif op == "avg":
            r = s.sum(axis=0) / len(s)
        else:
            raise ValueError(op)
        return np.asarray(r).astype(dt)
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    return ufunc.reduce(stack, axis=0, dtype=dt)


TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-12}


def compare(got: np.ndarray, want: np.ndarray, dtname: str, approx: bool = False) -> str | None:
    """None if equal (exactly, or within the dtype's tolerance when approx); else a description."""
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if got.size == 0:
        return None
    if dtname in FLOATS:
        g, w = got.astype(np.float64), want.astype(np.float64)
        if approx:
            bad = ~np.isclose(g, w, rtol=TOL[dtname], atol=TOL[dtname])
        else:
            bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
    else:
        g, w = got, want
        bad = g != w
    if not bad.any():
        return None
    idx = np.flatnonzero(bad)
    i = int(idx[0])
    return (f"{idx.size}/{got.size} elements differ; first at [{i}]: got {g.reshape(-1)[i]!r}, "
            f"want {w.reshape(-1)[i]!r}")


def block(count: int, size: int, index: int) -> tuple[int, int]:
    """numpy.array_split blocks: (offset, length) of block `index`."""
    base, extra = divmod(count, size)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def sentinel_like(n: int, dtname: str) -> np.ndarray:
    """An output buffer pre-filled with a value no reference produces by chance everywhere."""
    dt = np_dtype(dtname)
    if dtname in FLOATS:
        return np.full(n, 12345.0, dtype=np.float64).astype(dt) if n else np.empty(0, dt)
    return np.full(n, np.iinfo(dt).max - 3, dtype=dt)


# ----------------------------------------------------------------------------------------------
# checker: sections of checks, failures collected (not raised) so one run reports everything
# ----------------------------------------------------------------------------------------------
class SectionAbort(Exception):
    pass


class Checker:
    MAX_FAILURES = 25

    def __init__(self, ctx: Ctx, seed: int) -> None:
        self.ctx = ctx
        self.seed = seed
        self.sections: dict[str, dict[str, Any]] = {}
        self.cur: dict[str, Any] | None = None
        self.broken: str | None = None  # section whose exception left the communicator unusable

    def run(self, name: str, fn: Callable[[], Any]) -> None:
        """Run one section; an exception ends it (recorded) and, since the communicator may now
        be out of step or aborted, every later section is recorded as not run."""
        rec: dict[str, Any] = {"checks": 0, "failures": [], "error": None, "skipped": None, "seconds": 0.0}
        self.sections[name] = rec
        if self.broken:
            rec["skipped"] = f"not run: section {self.broken!r} raised first"
            return
        self.cur = rec
        t0 = time.monotonic()
        try:
            fn()
        except SectionAbort:
            pass
        except Exception as e:
            rec["error"] = {**exc_info(e), "traceback": traceback.format_exc()}
            self.broken = name
        finally:
            rec["seconds"] = round(time.monotonic() - t0, 3)
            self.cur = None

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """For programs with a single always-run section: like run(), as a with-block."""
        rec: dict[str, Any] = {"checks": 0, "failures": [], "error": None, "skipped": None, "seconds": 0.0}
        self.sections[name] = rec
        self.cur = rec
        t0 = time.monotonic()
        try:
            yield None
        except SectionAbort:
            pass
        except Exception as e:
            rec["error"] = {**exc_info(e), "traceback": traceback.format_exc()}
            self.broken = name
        finally:
            rec["seconds"] = round(time.monotonic() - t0, 3)
            self.cur = None

    def fail(self, desc: str) -> None:
        assert self.cur is not None
        if len(self.cur["failures"]) < self.MAX_FAILURES:
            self.cur["failures"].append(desc)
        else:
            self.cur["failures_truncated"] = True

    def expect(self, cond: bool, desc: str) -> None:
        assert self.cur is not None
        self.cur["checks"] += 1
        if not cond:
            self.fail(desc)

    def cmp(self, desc: str, got: Any, want: np.ndarray, dtname: str, approx: bool = False) -> None:
        assert self.cur is not None
        self.cur["checks"] += 1
        got = to_numpy(got)
        err = compare(got, want, dtname, approx)
        if err:
            self.fail(f"{desc}: {err}")

    def inputs(self, tag: int, n: int, dtname: str, kind: str, ranks: list[int]) -> list[np.ndarray]:
        return [make(self.seed, tag, r, n, dtname, kind) for r in ranks]

    def result(self) -> dict[str, Any]:
        return {"sections": self.sections}


def to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    import torch

    t = x.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16).copy()
    return t.numpy().copy()


def to_torch(a: np.ndarray) -> Any:
    import torch

    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def reductions_for(dtname: str) -> list[str]:
    return REDUCTIONS if dtname in FLOATS else [r for r in REDUCTIONS if r != "avg"]


def kind_of(op: str) -> str:
    return {"sum": "sum", "avg": "avg", "prod": "prod", "min": "minmax", "max": "minmax"}[op]


# ----------------------------------------------------------------------------------------------
# the collectives, one function per op, usable on any communicator
# ----------------------------------------------------------------------------------------------
def run_all_reduce(ck: Checker, comm: Any, members: list[int], tag: int, n: int, dt: str, op: str,
                   wrap: Callable[[np.ndarray], Any] = lambda a: a, label: str = "") -> None:
    xs = ck.inputs(tag, n, dt, kind_of(op), members)
    want = ref_reduce(np.stack(xs) if n else np.empty((len(xs), 0), np_dtype(dt)), op, dt)
    x = wrap(xs[comm.rank].copy())
    comm.all_reduce(x, op)
    ck.cmp(f"{label}all_reduce({op}) {dt} n={n}", x, want, dt, approx=(op == "avg"))


def run_reduce_scatter(ck: Checker, comm: Any, members: list[int], tag: int, n: int, dt: str, op: str,
                       wrap: Callable[[np.ndarray], Any] = lambda a: a, label: str = "") -> None:
    xs = ck.inputs(tag, n, dt, kind_of(op), members)
    full = ref_reduce(np.stack(xs) if n else np.empty((len(xs), 0), np_dtype(dt)), op, dt)
    off, ln = block(n, comm.size, comm.rank)
    out = wrap(sentinel_like(ln, dt))
    x = wrap(xs[comm.rank].copy())
    comm.reduce_scatter(out, x, op)
    ck.cmp(f"{label}reduce_scatter({op}) {dt} n={n}", out, full[off:off + ln], dt, approx=(op == "avg"))
    ck.cmp(f"{label}reduce_scatter({op}) {dt} n={n}: input untouched", x, xs[comm.rank], dt)


def run_all_gather(ck: Checker, comm: Any, members: list[int], tag: int, n: int, dt: str,
                   wrap: Callable[[np.ndarray], Any] = lambda a: a, label: str = "") -> None:
    xs = ck.inputs(tag, n, dt, "any", members)
    out = wrap(sentinel_like(n * comm.size, dt))
    comm.all_gather(out, wrap(xs[comm.rank].copy()))
    ck.cmp(f"{label}all_gather {dt} n={n}", out, np.concatenate(xs), dt)


def run_broadcast(ck: Checker, comm: Any, members: list[int], tag: int, n: int, dt: str, root: int,
                  wrap: Callable[[np.ndarray], Any] = lambda a: a, label: str = "") -> None:
    xs = ck.inputs(tag, n, dt, "any", members)
    x = wrap(xs[comm.rank].copy())
    comm.broadcast(x, root)
    ck.cmp(f"{label}broadcast root={root} {dt} n={n}", x, xs[root], dt)


def run_reduce(ck: Checker, comm: Any, members: list[int], tag: int, n: int, dt: str, op: str, root: int,
               wrap: Callable[[np.ndarray], Any] = lambda a: a, label: str = "") -> None:
    xs = ck.inputs(tag, n, dt, kind_of(op), members)
    x = wrap(xs[comm.rank].copy())
    comm.reduce(x, root, op)
    if comm.rank == root:
        want = ref_reduce(np.stack(xs) if n else np.empty((len(xs), 0), np_dtype(dt)), op, dt)
        ck.cmp(f"{label}reduce({op}) root={root} {dt} n={n}", x, want, dt, approx=(op == "avg"))
    else:
        ck.cmp(f"{label}reduce({op}) root={root} {dt} n={n}: non-root x must stay unchanged", x,
               xs[comm.rank], dt)


def run_all_to_all(ck: Checker, comm: Any, members: list[int], tag: int, per: int, dt: str,
                   wrap: Callable[[np.ndarray], Any] = lambda a: a, label: str = "") -> None:
    n = per * comm.size
    xs = ck.inputs(tag, n, dt, "any", members)
    out = wrap(sentinel_like(n, dt))
    comm.all_to_all(out, wrap(xs[comm.rank].copy()))
    want = np.concatenate([xs[i][comm.rank * per:(comm.rank + 1) * per] for i in range(comm.size)]) \
        if n else np.empty(0, np_dtype(dt))
    ck.cmp(f"{label}all_to_all {dt} per-block={per}", out, want, dt)


# ----------------------------------------------------------------------------------------------
# program: collectives (every op x dtype x size, groups, async, torch)
# ----------------------------------------------------------------------------------------------
def prog_collectives(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    seed = int(args.get("seed", 1234))
    only = set(args.get("sections") or [])
    use_torch = bool(args.get("torch"))
    if use_torch:
        import torch  # noqa: F401  (before init: all ranks reach the rendezvous together)
    comm = ctx.init()
    ck = Checker(ctx, seed)
    W, R = comm.size, comm.rank
    world = list(range(W))
    out: dict[str, Any] = {"rank": R, "size": W, "id": comm.id, "global_ranks": comm.global_ranks}

    def identity() -> None:
        ck.expect(comm.rank == ctx.rank, f"comm.rank {comm.rank} != RANK {ctx.rank}")
        ck.expect(comm.size == ctx.world, f"comm.size {comm.size} != WORLD_SIZE {ctx.world}")
        ck.expect(comm.id == 0, f"world communicator id {comm.id} != 0")
        ck.expect(comm.global_ranks == world, f"world global_ranks {comm.global_ranks}")
        # the job really runs on the transport it was asked for
        want_tr = os.environ.get("HETOBS_TRANSPORT", "auto")
        if W > 1 and want_tr != "auto":
            comm.barrier()  # TCP peers connect on first use; a barrier talks to every one
            links = comm.links()
            ck.expect(sorted(l["peer"] for l in links) == [r for r in world if r != R], f"links: {links}")
            ck.expect(all(l["transport"] == want_tr for l in links),
                      f"HETOBS_TRANSPORT={want_tr} but links use {[l['transport'] for l in links]}")

    def all_reduce() -> None:
        for dt in DTYPES:
            for n in SIZES:
                for op in reductions_for(dt):
                    run_all_reduce(ck, comm, world, tag_of("ar", dt, n, op), n, dt, op)
        # a contiguous 2-D array reduces elementwise
        xs = ck.inputs(tag_of("ar2d"), 6 * 5, "float32", "sum", world)
        x = xs[R].reshape(6, 5).copy()
        comm.all_reduce(x)
        ck.cmp("all_reduce 2-D float32", x.reshape(-1), ref_reduce(np.stack(xs), "sum", "float32"), "float32")

    def reduce_scatter() -> None:
        for dt in DTYPES:
            for n in SIZES + [3 * W + 1]:
                for op in reductions_for(dt):
                    run_reduce_scatter(ck, comm, world, tag_of("rs", dt, n, op), n, dt, op)

    def all_gather() -> None:
        for dt in DTYPES:
            for n in SIZES:
                run_all_gather(ck, comm, world, tag_of("ag", dt, n), n, dt)

    def broadcast() -> None:
        for root in world:
            for dt in DTYPES:
                for n in SIZES:
                    run_broadcast(ck, comm, world, tag_of("bc", dt, n, root), n, dt, root)

    def reduce() -> None:
        for root in world:
            for dt in DTYPES:
                for op in reductions_for(dt):
                    for n in (SIZES if op == "sum" else [1, 7, 1001]):
                        run_reduce(ck, comm, world, tag_of("rd", dt, n, op, root), n, dt, op, root)

    def all_to_all() -> None:
        for dt in DTYPES:
            for per in [0, 1, 7, 250, 16385]:
                run_all_to_all(ck, comm, world, tag_of("a2a", dt, per), per, dt)

    def barrier() -> None:
        marks = os.path.join(ctx.gates, "barrier-marks")
        os.makedirs(marks, exist_ok=True)
        for k in range(5):
            if R == (k % W) and W > 1:
                time.sleep(0.05)  # make one rank late, so a barrier that returns early shows
            open(os.path.join(marks, f"{k}-{R}"), "w").close()
            comm.barrier()
            missing = [r for r in world if not os.path.exists(os.path.join(marks, f"{k}-{r}"))]
            ck.expect(not missing, f"barrier {k} returned before ranks {missing} arrived")
        w = comm.barrier(async_op=True)
        ck.expect(w is not None and w.wait() is True, "async barrier: wait() did not return True")

    def send_recv() -> None:
        pairs = [(s, d) for s in world for d in world if s != d]
        for i, (src, dst) in enumerate(pairs):
            for n in [0, 1, 1001, 65540]:
                dt = DTYPES[(i + n) % len(DTYPES)]
                tag = tag_of("p2p", src, dst, n)
                data = make(seed, tag, src, n, dt)
                if R == src:
                    ck.expect(comm.send(data, dst) is None, "blocking send returned a Work")
                elif R == dst:
                    buf = sentinel_like(n, dt)
                    ck.expect(comm.recv(buf, src) is None, "blocking recv returned a Work")
                    ck.cmp(f"send {src}->{dst} {dt} n={n}", buf, data, dt)
        if W < 2:
            return
        # two messages on one link arrive in order
        if R == 0:
            a, b = make(seed, 1, 0, 500, "int32"), make(seed, 2, 0, 700, "int32")
            wa, wb = comm.send(a, 1, async_op=True), comm.send(b, 1, async_op=True)
            ck.expect(wa.wait() is True and wb.wait() is True, "async sends did not complete")
        elif R == 1:
            ba, bb = np.zeros(500, np.int32), np.zeros(700, np.int32)
            comm.recv(ba, 0)
            comm.recv(bb, 0)
            ck.cmp("ordered p2p #1", ba, make(seed, 1, 0, 500, "int32"), "int32")
            ck.cmp("ordered p2p #2", bb, make(seed, 2, 0, 700, "int32"), "int32")
        # ring shift: everyone sends right and receives from the left at once
        right, left = (R + 1) % W, (R - 1) % W
        for n in [1, 70000]:
            tag = tag_of("shift", n)
            ws = comm.send(make(seed, tag, R, n, "float32"), right, async_op=True)
            buf = np.zeros(n, np.float32)
            wr = comm.recv(buf, left, async_op=True)
            ck.expect(wr.wait() is True and ws.wait() is True, "ring shift: wait() not True")
            ck.cmp(f"ring shift n={n}", buf, make(seed, tag, left, n, "float32"), "float32")
        # a read-only array can be sent (send does not write)
        if R == 0:
            ro = make(seed, 3, 0, 33, "float64")
            ro.setflags(write=False)
            comm.send(ro, 1)
        elif R == 1:
            buf = np.zeros(33, np.float64)
            comm.recv(buf, 0)
            ck.cmp("send of a read-only array", buf, make(seed, 3, 0, 33, "float64"), "float64")

    def large() -> None:
        for dt in DTYPES:
            n = LARGE_BYTES // np_dtype(dt).itemsize
            run_all_reduce(ck, comm, world, tag_of("L-ar", dt), n, dt, "sum", label="large ")
        n32 = LARGE_BYTES // 4
        run_all_reduce(ck, comm, world, tag_of("L-ar-max"), n32, "float32", "max", label="large ")
        run_all_reduce(ck, comm, world, tag_of("L-ar-avg"), n32, "bfloat16", "avg", label="large ")
        # Over TCP the ring is pipelined in 512 KiB segments: odd counts that cut blocks and
        # segments unevenly, several segments per block at every world size, avg per segment.
        run_all_reduce(ck, comm, world, tag_of("L-ar-odd"), n32 + 12345, "float32", "sum", label="large ")
        run_all_reduce(ck, comm, world, tag_of("L-ar-odd8"), 5 * LARGE_BYTES // 4 + 7, "int8", "max", label="large ")
        run_all_reduce(ck, comm, world, tag_of("L-ar-odd-avg"), LARGE_BYTES // 8 + 3, "float64", "avg", label="large ")
        run_reduce_scatter(ck, comm, world, tag_of("L-rs"), n32 + 5, "float32", "sum", label="large ")
        run_reduce_scatter(ck, comm, world, tag_of("L-rs8"), LARGE_BYTES + 3, "int8", "sum", label="large ")
        run_all_gather(ck, comm, world, tag_of("L-ag"), n32 // W + 1, "float32", label="large ")
        run_broadcast(ck, comm, world, tag_of("L-bc"), LARGE_BYTES + 1, "uint8", W - 1, label="large ")
        run_reduce(ck, comm, world, tag_of("L-rd"), LARGE_BYTES // 8, "float64", "sum", 1 % W, label="large ")
        run_all_to_all(ck, comm, world, tag_of("L-a2a"), n32 // W + 1, "float32", label="large ")
        if W > 1:
            data = make(seed, tag_of("L-p2p"), 0, LARGE_BYTES // 8, "int64")
            if R == 0:
                comm.send(data, W - 1)
            elif R == W - 1:
                buf = np.zeros_like(data)
                comm.recv(buf, 0)
                ck.cmp("large send/recv", buf, data, "int64")

    def final() -> None:
        # every rank still agrees at the end (sequence numbers aligned)
        run_all_reduce(ck, comm, world, tag_of("final"), 11, "int64", "sum")

    sections: list[tuple[str, Callable[[], None]]] = [
        ("identity", identity), ("all_reduce", all_reduce), ("reduce_scatter", reduce_scatter),
        ("all_gather", all_gather), ("broadcast", broadcast), ("reduce", reduce), ("all_to_all", all_to_all),
        ("barrier", barrier), ("send_recv", send_recv), ("large", large),
        ("split", lambda: prog_split_checks(ck, comm)), ("new_group", lambda: prog_new_group_checks(ck, comm)),
        ("async", lambda: prog_async_checks(ck, comm, ctx)),
    ]
    if use_torch:
        sections.append(("torch", lambda: prog_torch_checks(ck, comm)))
    sections.append(("final", final))
    for name, fn in sections:
        if not only or name in only or name == "final":
            ck.run(name, fn)
    out.update(ck.result())
    try:
        comm.close()
        comm.close()  # idempotent
        out["close_error"] = None
    except Exception as e:
        out["close_error"] = exc_info(e)
    return out


def _ids_of(comm: Any, sub: Any) -> list[int]:
    """Every world rank's id of its `sub` (-1 where None), via all_gather on the world."""
    mine = np.array([sub.id if sub is not None else -1], np.int64)
    allv = np.zeros(comm.size, np.int64)
    comm.all_gather(allv, mine)
    return [int(v) for v in allv]


def _exercise(ck: Checker, sub: Any, label: str) -> None:
    members = sub.global_ranks
    for dt in ["int32", "bfloat16", "float64", "uint8"]:
        for n in [0, 5, 1001, 65540]:
            run_all_reduce(ck, sub, members, tag_of(label, "ar", dt, n), n, dt, "sum", label=label + " ")
    run_all_reduce(ck, sub, members, tag_of(label, "ar-max"), 777, "float32", "max", label=label + " ")
    run_all_gather(ck, sub, members, tag_of(label, "ag"), 333, "int64", label=label + " ")
    run_reduce_scatter(ck, sub, members, tag_of(label, "rs"), 1001, "float32", "sum", label=label + " ")
    for root in range(sub.size):
        run_broadcast(ck, sub, members, tag_of(label, "bc", root), 1001, "float16", root, label=label + " ")
        run_reduce(ck, sub, members, tag_of(label, "rd", root), 99, "int32", "sum", root, label=label + " ")
    run_all_to_all(ck, sub, members, tag_of(label, "a2a"), 17, "int8", label=label + " ")
    sub.barrier()
    if sub.size > 1:
        # p2p in sub-communicator ranks (not world ranks)
        data = make(ck.seed, tag_of(label, "p2p"), members[0], 64, "float32")
        if sub.rank == 0:
            sub.send(data, sub.size - 1)
        elif sub.rank == sub.size - 1:
            buf = np.zeros(64, np.float32)
            sub.recv(buf, 0)
            ck.cmp(f"{label} send/recv in sub ranks", buf, data, "float32")


def prog_split_checks(ck: Checker, comm: Any) -> None:
    W, R = comm.size, comm.rank
    world = list(range(W))
    # parity split, reverse order by key
    color = R % 2
    sub = comm.split(color, key=-R)
    expect_members = sorted([r for r in world if r % 2 == color], key=lambda r: -r)
    ck.expect(sub is not None, "split(color>=0) returned None")
    if sub is None:
        raise SectionAbort
    ck.expect(sub.global_ranks == expect_members, f"split members {sub.global_ranks} != {expect_members}")
    ck.expect(sub.rank == expect_members.index(R), f"split rank {sub.rank} != {expect_members.index(R)}")
    ck.expect(sub.size == len(expect_members), f"split size {sub.size} != {len(expect_members)}")
    ck.expect(sub.id != comm.id, f"split id {sub.id} equals the world's {comm.id}")
    ids = _ids_of(comm, sub)
    for a in world:
        for b in world:
            if a % 2 == b % 2:
                ck.expect(ids[a] == ids[b], f"ranks {a},{b} in one split group report ids {ids[a]} != {ids[b]}")
            else:
                ck.expect(ids[a] != ids[b], f"ranks {a},{b} in different split groups share id {ids[a]}")
    # interleave world and sub ops: each keeps its own sequence
    run_all_reduce(ck, comm, world, tag_of("sp-w1"), 100, "int64", "sum", label="world(between) ")
    _exercise(ck, sub, f"split[{color}]")
    run_all_reduce(ck, comm, world, tag_of("sp-w2"), 100, "int64", "sum", label="world(between) ")
    # negative color: takes part, joins none
    sub2 = comm.split(-1 if R == 0 else 7, key=R)
    if R == 0:
        ck.expect(sub2 is None, "split(color=-1) did not return None")
    else:
        ck.expect(sub2 is not None and sub2.global_ranks == world[1:],
                  f"split(7) members {None if sub2 is None else sub2.global_ranks}")
        ck.expect(sub2 is not None and sub2.id not in (comm.id, sub.id), "split(7) id not new")
        if sub2 is not None:
            _exercise(ck, sub2, "split-no-rank0")
    # split of a split (same members, new communicator)
    sub3 = sub.split(0, key=sub.rank)
    ck.expect(sub3 is not None and sub3.global_ranks == sub.global_ranks, "nested split members")
    if sub3 is not None:
        ck.expect(sub3.id not in (comm.id, sub.id), f"nested split id {sub3.id} reused")
        run_all_reduce(ck, sub3, sub3.global_ranks, tag_of("sp3"), 4097, "float32", "sum", label="nested ")
    for c in (sub3, sub2, sub):
        if c is not None:
            c.close()
    run_all_reduce(ck, comm, world, tag_of("sp-w3"), 100, "int64", "sum", label="world(after close) ")


def prog_new_group_checks(ck: Checker, comm: Any) -> None:
    W, R = comm.size, comm.rank
    world = list(range(W))
    members = list(dict.fromkeys([W - 1, 0] + ([1] if W >= 3 else [])))  # reversed order; [0] on 1 rank
    g = comm.new_group(members)
    if R in members:
        ck.expect(g is not None, "new_group member got None")
        if g is None:
            raise SectionAbort
        ck.expect(g.global_ranks == members, f"new_group members {g.global_ranks} != {members}")
        ck.expect(g.rank == members.index(R), f"new_group rank {g.rank} != {members.index(R)}")
        ck.expect(g.id != comm.id, "new_group id equals the world's")
    else:
        ck.expect(g is None, "non-member got a communicator from new_group")
    ids = _ids_of(comm, g)
    ck.expect(len({ids[m] for m in members}) == 1, f"new_group members disagree on its id: {ids}")
    if g is not None:
        _exercise(ck, g, "new_group")
    # the same ranks again: a distinct communicator, both usable, interleaved
    g2 = comm.new_group(members)
    ids2 = _ids_of(comm, g2)
    if g is not None and g2 is not None:
        ck.expect(g2.id != g.id, f"second new_group of the same ranks reuses id {g.id}")
        ck.expect(ids2[members[0]] == g2.id, "second new_group id not agreed")
        run_all_reduce(ck, g2, members, tag_of("ng2-a"), 2000, "int32", "sum", label="new_group#2 ")
        run_all_reduce(ck, g, members, tag_of("ng1-b"), 2000, "int32", "sum", label="new_group#1 ")
        run_all_reduce(ck, g2, members, tag_of("ng2-b"), 2000, "int32", "max", label="new_group#2 ")
    # every rank, in order
    gall = comm.new_group(world)
    ck.expect(gall is not None and gall.global_ranks == world, "new_group(all) members")
    if gall is not None:
        ck.expect(gall.id != comm.id, "new_group(all) id equals the world's")
        run_all_gather(ck, gall, world, tag_of("ngall"), 4000, "float64", label="new_group(all) ")
    for c in (gall, g2, g):
        if c is not None:
            c.close()
    run_all_reduce(ck, comm, world, tag_of("ng-after"), 100, "int64", "sum", label="world(after groups) ")


def prog_async_checks(ck: Checker, comm: Any, ctx: Ctx) -> None:
    W, R = comm.size, comm.rank
    world = list(range(W))
    # several ops in flight at once, waited in reverse order
    cases = []
    for i, (dt, n, op) in enumerate([("float32", 1001, "sum"), ("int64", 65540, "max"),
                                     ("bfloat16", 7, "sum"), ("uint8", 300000, "sum")]):
        xs = ck.inputs(tag_of("as", i), n, dt, kind_of(op), world)
        x = xs[R].copy()
        w = comm.all_reduce(x, op, async_op=True)
        ck.expect(w is not None, "all_reduce(async_op=True) returned None")
        cases.append((w, x, ref_reduce(np.stack(xs), op, dt), dt, f"async all_reduce #{i} {dt} n={n} {op}"))
    xs = ck.inputs(tag_of("as-ag"), 500, "int32", "any", world)
    ag_out = np.zeros(500 * W, np.int32)
    w_ag = comm.all_gather(ag_out, xs[R].copy(), async_op=True)
    cases.append((w_ag, ag_out, np.concatenate(xs), "int32", "async all_gather"))
    bx = ck.inputs(tag_of("as-bc"), 4096, "float64", "any", world)
    b = bx[R].copy()
    cases.append((comm.broadcast(b, W - 1, async_op=True), b, bx[W - 1], "float64", "async broadcast"))
    for w, buf, want, dt, desc in reversed(cases):
        ck.expect(w.wait() is True, f"{desc}: wait() did not return True")
        ck.expect(w.is_completed(), f"{desc}: is_completed() False after wait()")
        ck.cmp(desc, buf, want, dt)
    # a blocking op right after an async one: ordered
    xs = ck.inputs(tag_of("as-mix"), 2000, "float32", "sum", world)
    x1 = xs[R].copy()
    w = comm.all_reduce(x1, async_op=True)
    run_all_reduce(ck, comm, world, tag_of("as-mix2"), 3000, "int32", "sum", label="blocking after async ")
    ck.expect(w.wait() is True, "async before blocking: wait() not True")
    ck.cmp("async before blocking", x1, ref_reduce(np.stack(xs), "sum", "float32"), "float32")
    # wait(timeout) returns False while a peer has not joined: rank 0 is held at a gate that rank 1
    # opens only after its own wait(0.2) came back False.
    if W >= 2 and ctx.gates:
        xs = ck.inputs(tag_of("as-hold"), 1000, "int64", "sum", world)
        x = xs[R].copy()
        if R == 0:
            ctx.gate_wait("async-hold")
            w = comm.all_reduce(x, async_op=True)
        else:
            w = comm.all_reduce(x, async_op=True)
            if R == 1:
                t0 = time.monotonic()
                done = w.wait(0.2)
                took = time.monotonic() - t0
                ck.expect(done is False, "wait(0.2) returned True although rank 0 had not joined")
                ck.expect(not w.is_completed(), "is_completed() True although rank 0 had not joined")
                ck.expect(done is not False or took >= 0.15, f"wait(0.2) returned False after only {took:.3f}s")
                ctx.gate_open("async-hold")
        ck.expect(w.wait() is True, "held op: wait() not True")
        ck.expect(w.is_completed(), "held op: is_completed() False after wait()")
        ck.cmp("held async all_reduce", x, ref_reduce(np.stack(xs), "sum", "int64"), "int64")


def prog_torch_checks(ck: Checker, comm: Any) -> None:
    import torch

    W, R = comm.size, comm.rank
    world = list(range(W))
    for dt in DTYPES:
        for n in [0, 7, 1001, 65540]:
            for op in ["sum", "max"] + (["avg"] if dt in FLOATS else []):
                run_all_reduce(ck, comm, world, tag_of("t-ar", dt, n, op), n, dt, op, wrap=to_torch, label="torch ")
        run_all_gather(ck, comm, world, tag_of("t-ag", dt), 1001, dt, wrap=to_torch, label="torch ")
        run_broadcast(ck, comm, world, tag_of("t-bc", dt), 1001, dt, W - 1, wrap=to_torch, label="torch ")
        run_reduce_scatter(ck, comm, world, tag_of("t-rs", dt), 1003, dt, "sum", wrap=to_torch, label="torch ")
        run_reduce(ck, comm, world, tag_of("t-rd", dt), 999, dt, "min", 0, wrap=to_torch, label="torch ")
        run_all_to_all(ck, comm, world, tag_of("t-a2a", dt), 33, dt, wrap=to_torch, label="torch ")
    # 2-D tensor, async
    xs = ck.inputs(tag_of("t-2d"), 64 * 33, "float32", "sum", world)
    t = torch.from_numpy(xs[R].reshape(64, 33).copy())
    w = comm.all_reduce(t, async_op=True)
    ck.expect(w.wait() is True, "torch async wait() not True")
    ck.cmp("torch 2-D async all_reduce", t.reshape(-1), ref_reduce(np.stack(xs), "sum", "float32"), "float32")
    # p2p with tensors
    if W > 1:
        data = make(ck.seed, tag_of("t-p2p"), 0, 5000, "bfloat16")
        if R == 0:
            comm.send(to_torch(data), W - 1)
        elif R == W - 1:
            buf = torch.zeros(5000, dtype=torch.bfloat16)
            comm.recv(buf, 0)
            ck.cmp("torch bf16 send/recv", buf, data, "bfloat16")


# ----------------------------------------------------------------------------------------------
# program: random mixed ops
# ----------------------------------------------------------------------------------------------
def prog_random_mixed(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    seed = int(args.get("seed", 99))
    n_ops = int(args.get("ops", 3000))
    max_n = int(args.get("max_n", 100_000))
    comm = ctx.init()
    W, R = comm.size, comm.rank
    world = list(range(W))
    ck = Checker(ctx, seed)
    rng = random.Random(seed)  # same sequence on every rank
    counts: dict[str, int] = {}
    res: dict[str, Any] = {"rank": R}
    with ck.section("random"):
        # warm-up that creates everything the run will use (groups, async machinery), then snapshot
        sub = comm.split(R % 2, key=R)
        comm.all_reduce(np.ones(10, np.float32))
        sub.all_reduce(np.ones(10, np.float32))
        comm.all_reduce(np.ones(200000, np.float32), async_op=True).wait()
        sub.all_gather(np.zeros(2 * sub.size, np.int8), np.zeros(2, np.int8))
        if W > 1:
            if R == 0:
                comm.send(np.ones(4, np.int8), 1)
            elif R == 1:
                comm.recv(np.ones(4, np.int8), 0)
        comm.barrier()
        fds0, shm0 = fd_count(), shm_mine(ctx.job_id)
        pending: list[tuple[int, Any, Callable[[], None]]] = []  # (due op index, work, check)

        kinds = ["all_reduce"] * 4 + ["reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
                                      "barrier", "send_recv"]
        for i in range(n_ops):
            # finish due async ops first
            for item in [p for p in pending if p[0] <= i]:
                pending.remove(item)
                ck.expect(item[1].wait() is True, f"op {i}: async wait() not True")
                item[2]()
            if i % 500 == 250:
                # a short-lived communicator: made, used, closed; its fds and segments must go too
                g = comm.new_group(world[::-1])
                run_all_reduce(ck, g, g.global_ranks, tag_of("mix-g", i), 5000, "float32", "sum",
                               label=f"op {i} short-lived group ")
                g.close()
                counts["short_lived_groups"] = counts.get("short_lived_groups", 0) + 1
            # every rank draws the same numbers in the same order, whatever its role
            u = [rng.random() for _ in range(10)]
            use_sub = u[0] < 0.2
            c = sub if use_sub else comm
            members = c.global_ranks if use_sub else world
            kind = kinds[int(u[1] * len(kinds))]
            dt = DTYPES[int(u[2] * len(DTYPES))]
            n = 0 if u[3] < 0.05 else min(max_n, int(10 ** (u[4] * np.log10(max_n))))
            ops = reductions_for(dt)
            op = ops[int(u[5] * len(ops))]
            root = int(u[6] * c.size)
            is_async = u[7] < 0.15
            due = i + int(u[8] * 4)
            tag = tag_of("mix", i)
            counts[kind] = counts.get(kind, 0) + 1
            label = f"op {i} ({'sub' if use_sub else 'world'} {kind} {dt} n={n} op={op} root={root})"
            kw = {"async_op": True} if is_async else {}
            check: Callable[[], None]
            if kind == "all_reduce":
                xs = ck.inputs(tag, n, dt, kind_of(op), members)
                x = xs[c.rank].copy()
                w = c.all_reduce(x, op, **kw)
                ref = ref_reduce(np.stack(xs) if n else np.empty((len(xs), 0), np_dtype(dt)), op, dt)
                check = (lambda x=x, ref=ref, dt=dt, op=op, label=label:
                         ck.cmp(label, x, ref, dt, approx=op == "avg"))
            elif kind == "reduce_scatter":
                xs = ck.inputs(tag, n, dt, kind_of(op), members)
                off, ln = block(n, c.size, c.rank)
                o = sentinel_like(ln, dt)
                w = c.reduce_scatter(o, xs[c.rank].copy(), op, **kw)
                ref = ref_reduce(np.stack(xs) if n else np.empty((len(xs), 0), np_dtype(dt)), op, dt)[off:off + ln]
                check = (lambda o=o, ref=ref, dt=dt, op=op, label=label:
                         ck.cmp(label, o, ref, dt, approx=op == "avg"))
            elif kind == "all_gather":
                n = n // c.size
                xs = ck.inputs(tag, n, dt, "any", members)
                o = sentinel_like(n * c.size, dt)
                w = c.all_gather(o, xs[c.rank].copy(), **kw)
                ref = np.concatenate(xs)
                check = lambda o=o, ref=ref, dt=dt, label=label: ck.cmp(label, o, ref, dt)
            elif kind == "broadcast":
                xs = ck.inputs(tag, n, dt, "any", members)
                x = xs[c.rank].copy()
                w = c.broadcast(x, root, **kw)
                check = lambda x=x, ref=xs[root], dt=dt, label=label: ck.cmp(label, x, ref, dt)
            elif kind == "reduce":
                xs = ck.inputs(tag, n, dt, kind_of(op), members)
                x = xs[c.rank].copy()
                w = c.reduce(x, root, op, **kw)
                if c.rank == root:
                    ref = ref_reduce(np.stack(xs) if n else np.empty((len(xs), 0), np_dtype(dt)), op, dt)
                else:
                    ref = xs[c.rank]
                check = (lambda x=x, ref=ref, dt=dt, op=op, label=label, at_root=c.rank == root:
                         ck.cmp(label, x, ref, dt, approx=op == "avg" and at_root))
            elif kind == "all_to_all":
                per = n // (c.size * 4)
                xs = ck.inputs(tag, per * c.size, dt, "any", members)
                o = sentinel_like(per * c.size, dt)
                w = c.all_to_all(o, xs[c.rank].copy(), **kw)
                ref = (np.concatenate([xs[j][c.rank * per:(c.rank + 1) * per] for j in range(c.size)])
                       if per else np.empty(0, np_dtype(dt)))
                check = lambda o=o, ref=ref, dt=dt, label=label: ck.cmp(label, o, ref, dt)
            elif kind == "barrier":
                w = c.barrier(**kw)
                check = lambda: None
            else:  # send_recv: a random pair of this communicator; others skip
                if c.size < 2:
                    continue
                src = root
                dst = (src + 1 + int(u[9] * (c.size - 1))) % c.size
                data = make(seed, tag, members[src], n, dt)
                if c.rank == src:
                    w = c.send(data, dst, **kw)
                    check = lambda: None
                elif c.rank == dst:
                    buf = sentinel_like(n, dt)
                    w = c.recv(buf, src, **kw)
                    check = lambda buf=buf, data=data, dt=dt, label=label: ck.cmp(label, buf, data, dt)
                else:
                    continue
            if is_async:
                ck.expect(w is not None, f"{label}: async_op=True returned no Work")
                pending.append((due, w, check))
            else:
                ck.expect(w is None, f"{label}: blocking op returned {w!r}")
                check()
        for _, w, check in pending:
            ck.expect(w.wait() is True, "final async wait() not True")
            check()
        comm.barrier()
        sub.barrier()
        fds1, shm1 = fd_count(), shm_mine(ctx.job_id)
        ck.expect(fds1 <= fds0, f"open fds grew from {fds0} to {fds1} over {n_ops} ops")
        ck.expect(not set(shm1) - set(shm0), f"/dev/shm entries grew: {shm0} -> {shm1}")
        res.update({"fds": [fds0, fds1], "shm": [shm0, shm1]})
        sub.close()
    comm.close()
    res.update(ck.result())
    res["counts"] = counts
    return res


# ----------------------------------------------------------------------------------------------
# programs: API errors
# ----------------------------------------------------------------------------------------------
def prog_api_errors(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    use_torch = bool(args.get("torch"))
    if use_torch:
        import torch

    comm = ctx.init()
    W, R = comm.size, comm.rank
    outcomes: list[dict[str, Any]] = []

    def bad(name: str, fn: Callable[[], Any], must_contain: list[str], untouched: list[Any] = ()) -> None:
        before = [np.ascontiguousarray(to_numpy(u)).tobytes() for u in untouched]
        rec: dict[str, Any] = {"case": name, "ok": False}
        try:
            fn()
        except ValueError as e:
            msg = str(e)
            missing = [s for s in must_contain if s.lower() not in msg.lower()]
            rec.update(type=type(e).__name__, msg=msg)
            if missing:
                rec["why"] = f"ValueError message lacks {missing}"
            else:
                rec["ok"] = True
        except BaseException as e:
            rec.update(type=type(e).__name__, msg=str(e), why="raised something other than ValueError")
        else:
            rec["why"] = "no exception"
        for i, (u, b) in enumerate(zip(untouched, before)):
            if np.ascontiguousarray(to_numpy(u)).tobytes() != b:
                rec["ok"] = False
                rec["why"] = rec.get("why", "") + f"; buffer #{i} was modified"
        outcomes.append(rec)

    f32 = np.arange(16, dtype=np.float32)
    i32 = np.arange(16, dtype=np.int32)
    ro = np.arange(16, dtype=np.float32)
    ro.setflags(write=False)
    fortran = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    out_small = np.zeros(16 * W - 1, np.float32)
    # unsupported dtypes
    bad("complex64", lambda: comm.all_reduce(np.zeros(4, np.complex64)), ["dtype", "complex64"])
    bad("bool", lambda: comm.all_reduce(np.zeros(4, np.bool_)), ["dtype", "bool"])
    bad("uint16", lambda: comm.broadcast(np.zeros(4, np.uint16)), ["dtype", "uint16"])
    bad("object", lambda: comm.all_reduce(np.zeros(4, object)), ["dtype"])
    bad("list", lambda: comm.all_reduce([1.0, 2.0]), ["list"])
    # memory layout
    bad("non-contiguous", lambda: comm.all_reduce(f32[::2]), ["contiguous"], [f32])
    bad("fortran-order", lambda: comm.all_reduce(fortran), ["contiguous"], [fortran])
    bad("non-contiguous all_gather x", lambda: comm.all_gather(np.zeros(8 * W, np.float32), f32[::2]),
        ["contiguous"])
    # read-only outputs
    bad("read-only all_reduce", lambda: comm.all_reduce(ro), ["read-only"], [ro])
    bad("read-only broadcast", lambda: comm.broadcast(ro, 0), ["read-only"], [ro])
    bad("read-only reduce", lambda: comm.reduce(ro, 0), ["read-only"], [ro])
    ro_out = np.zeros(16 * W, np.float32)
    ro_out.setflags(write=False)
    bad("read-only all_gather out", lambda: comm.all_gather(ro_out, f32), ["read-only"], [ro_out])
    bad("read-only recv", lambda: comm.recv(ro, (R + 1) % W), ["read-only"], [ro])
    # sizes
    bad("all_gather out too small", lambda: comm.all_gather(out_small, f32), ["all_gather out", str(16 * W - 1)],
        [out_small])
    bad("all_gather out too big", lambda: comm.all_gather(np.zeros(16 * W + 1, np.float32), f32), ["out"])
    rs_bad = np.zeros(16 // W + 2, np.float32)
    bad("reduce_scatter out wrong", lambda: comm.reduce_scatter(rs_bad, f32), ["reduce_scatter out"], [rs_bad])
    a2a_n = 16 * W + 1
    bad("all_to_all uneven", lambda: comm.all_to_all(np.zeros(a2a_n, np.float32), np.zeros(a2a_n, np.float32)),
        ["all_to_all"])
    bad("all_to_all out size", lambda: comm.all_to_all(np.zeros(8 * W, np.float32), np.zeros(4 * W, np.float32)),
        ["all_to_all out"])
    bad("all_gather dtype mismatch", lambda: comm.all_gather(np.zeros(16 * W, np.float64), f32), ["dtype"])
    bad("reduce_scatter dtype mismatch",
        lambda: comm.reduce_scatter(np.zeros(block(16, W, R)[1], np.int32), f32), ["dtype"])
    # roots and peers
    bad("broadcast root=size", lambda: comm.broadcast(f32, W), ["root"], [f32])
    bad("broadcast root=-1", lambda: comm.broadcast(f32, -1), ["root"], [f32])
    bad("broadcast root=0.0", lambda: comm.broadcast(f32, 0.0), ["root"], [f32])
    bad("reduce root=size", lambda: comm.reduce(f32, W + 3), ["root"], [f32])
    bad("send to self", lambda: comm.send(f32, R), ["peer"])
    bad("send peer out of range", lambda: comm.send(f32, W), ["peer"])
    bad("recv from self", lambda: comm.recv(f32, R), ["peer"], [f32])
    bad("recv peer negative", lambda: comm.recv(f32, -1), ["peer"], [f32])
    # reductions
    bad("avg on int32", lambda: comm.all_reduce(i32, "avg"), ["avg"], [i32])
    bad("avg on uint8", lambda: comm.all_reduce(np.ones(4, np.uint8), "avg"), ["avg"])
    bad("avg on int64 reduce", lambda: comm.reduce(np.ones(4, np.int64), 0, "avg"), ["avg"])
    bad("avg on int8 reduce_scatter",
        lambda: comm.reduce_scatter(np.zeros(block(16, W, R)[1], np.int8), np.ones(16, np.int8), "avg"), ["avg"])
    bad("unknown op", lambda: comm.all_reduce(f32, "mean"), ["mean"], [f32])
    # groups
    bad("new_group duplicate ranks", lambda: comm.new_group([0, 0]), ["ranks"])
    bad("new_group empty", lambda: comm.new_group([]), ["ranks"])
    bad("new_group out of range", lambda: comm.new_group([0, W]), ["ranks"])
    if use_torch:
        t = torch.arange(32, dtype=torch.float32)
        t2 = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        bad("torch non-contiguous", lambda: comm.all_reduce(t[::2]), ["contiguous"], [t])
        bad("torch transposed", lambda: comm.all_reduce(t2.t()), ["contiguous"], [t2])
        bad("torch complex64", lambda: comm.all_reduce(torch.zeros(4, dtype=torch.complex64)), ["dtype"])
        bad("torch bool", lambda: comm.all_reduce(torch.zeros(4, dtype=torch.bool)), ["dtype"])
        bad("torch uint16" if hasattr(torch, "uint16") else "torch int16",
            lambda: comm.all_reduce(torch.zeros(4, dtype=getattr(torch, "uint16", torch.int16))), ["dtype"])
        bad("torch meta device", lambda: comm.all_reduce(torch.zeros(4, device="meta")), ["meta"])
        bad("torch avg on int", lambda: comm.all_reduce(torch.ones(4, dtype=torch.int32), "avg"), ["avg"])
        bad("torch all_gather out size", lambda: comm.all_gather(torch.zeros(16 * W + 2), torch.zeros(16)), ["out"])
        bad("torch non-contiguous all_gather out",
            lambda: comm.all_gather(torch.zeros(2 * 16 * W)[::2], torch.zeros(16)), ["contiguous"])
    # nothing above was sent: the next collectives line up and are right
    ck = Checker(ctx, 5)
    with ck.section("after_errors"):
        run_all_reduce(ck, comm, list(range(W)), 1, 1001, "float32", "sum")
        run_broadcast(ck, comm, list(range(W)), 2, 17, "int64", W - 1)
        recs = None
        try:
            recs = comm.records()
        except Exception as e:  # records are another issue's; report, do not fail here
            recs = {"unavailable": exc_info(e)}
    comm.close()
    return {"rank": R, "outcomes": outcomes, **ck.result(),
            "records": recs if isinstance(recs, dict) else [dict(r) for r in recs][-5:]}


# ----------------------------------------------------------------------------------------------
# programs: faults
# ----------------------------------------------------------------------------------------------
def prog_kill_loop(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """Loop all_reduce on 1 MiB until an error; report 'looping' after a few iterations (the test
    SIGKILLs the victim then). Record the error, then what a further op raises."""
    n = int(args.get("n", 262144))
    max_s = float(args.get("max_seconds", 20.0))
    comm = ctx.init()
    x = np.ones(n, np.float32)
    res: dict[str, Any] = {"rank": comm.rank, "iterations": 0}
    t_end = time.monotonic() + max_s
    i = 0
    try:
        while time.monotonic() < t_end:
            x.fill(1.0)
            comm.all_reduce(x)
            i += 1
            if i == 3:
                ctx.event("looping")
        res["error"] = None
    except Exception as e:
        res["error"] = exc_info(e)
    res["iterations"] = i
    try:
        comm.all_reduce(np.ones(16, np.float32))
        res["after"] = None
    except Exception as e:
        res["after"] = exc_info(e)
    t0 = time.monotonic()
    try:
        comm.close()
        res["close"] = None
    except Exception as e:
        res["close"] = exc_info(e)
    res["close_seconds"] = time.monotonic() - t0
    return res


def prog_auth(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """A job with a secret: report each rank's listener, wait while strangers knock, then run
    collectives and check them."""
    rounds = int(args.get("rounds", 30))
    comm = ctx.init()
    W, R = comm.size, comm.rank
    world = list(range(W))
    ck = Checker(ctx, 77)
    with ck.section("before"):
        run_all_reduce(ck, comm, world, 1, 1000, "float32", "sum")
    addr, how = comm_address(comm)
    ctx.event("address", address=addr, how=how)
    ctx.gate_wait(f"go-{R}")
    with ck.section("after"):
        for k in range(rounds):
            run_all_reduce(ck, comm, world, tag_of("auth", k), 1000 + 7919 * k % 70000, "int32", "sum")
            run_all_gather(ck, comm, world, tag_of("auth-ag", k), 100, "float64")
    comm.close()
    return {"rank": R, "address": addr, "address_api": how, **ck.result()}


def prog_mismatch(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    variant = args["variant"]
    comm = ctx.init()
    W, R = comm.size, comm.rank
    n = 1000
    for _ in range(3):
        comm.all_reduce(np.ones(n, np.float32))
    comm.barrier()
    res: dict[str, Any] = {"rank": R, "variant": variant}
    x = np.ones(n, np.float32)
    t0 = time.monotonic()
    try:
        if variant == "op":  # rank 2 all_gather, others all_reduce
            if R == 2:
                comm.all_gather(np.zeros(n * W, np.float32), x)
            else:
                comm.all_reduce(x)
        elif variant == "count":  # rank 2 one element more
            comm.all_reduce(np.ones(n + 1, np.float32) if R == 2 else x)
        elif variant == "count2":  # ranks 1 and 2 one element more (5 ranks: 3 agree)
            comm.all_reduce(np.ones(n + 1, np.float32) if R in (1, 2) else x)
        elif variant == "dtype":  # same byte count, other dtype
            comm.all_reduce(np.ones(n, np.int32) if R == 2 else x)
        elif variant == "redop":
            comm.all_reduce(x, "max" if R == 2 else "sum")
        elif variant == "root":  # broadcast root 1 on rank 3, root 0 elsewhere
            comm.broadcast(x, 1 if R == 3 else 0)
        else:
            raise ValueError(variant)
        res["error"] = None
    except Exception as e:
        res["error"] = exc_info(e)
    res["seconds"] = time.monotonic() - t0
    try:
        comm.all_reduce(np.ones(16, np.float32))
        res["after"] = None
    except Exception as e:
        res["after"] = exc_info(e)
    try:
        comm.close()
        res["close"] = None
    except Exception as e:
        res["close"] = exc_info(e)
    return res


def prog_timeout(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """2 ranks: rank 1 never calls the op (held at a gate until the test has seen rank 0's error)."""
    per_op = args.get("per_op")
    comm = ctx.init()
    R = comm.rank
    comm.barrier()
    res: dict[str, Any] = {"rank": R}
    if R == 0:
        x = np.ones(1000, np.float32)
        t0 = time.monotonic()
        try:
            if per_op is None:
                comm.all_reduce(x)
            else:
                comm.all_reduce(x, timeout=float(per_op))
            res["error"] = None
        except Exception as e:
            res["error"] = exc_info(e)
        res["seconds"] = time.monotonic() - t0
        ctx.event("raised")
        try:
            comm.all_reduce(x)
            res["after"] = None
        except Exception as e:
            res["after"] = exc_info(e)
    else:
        ctx.gate_wait("release-1")
    t1 = time.monotonic()
    try:
        comm.close()
        res["close"] = None
    except Exception as e:
        res["close"] = exc_info(e)
    res["close_seconds"] = time.monotonic() - t1
    return res


def prog_async_timeout(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """Same as prog_timeout with async_op=True: Work.wait() re-raises the op's OpTimeoutError."""
    comm = ctx.init()
    R = comm.rank
    comm.barrier()
    res: dict[str, Any] = {"rank": R}
    if R == 0:
        t0 = time.monotonic()
        try:
            w = comm.all_reduce(np.ones(10, np.float32), async_op=True, timeout=1.0)
            res["issued_seconds"] = time.monotonic() - t0
            w.wait()
            res["error"] = None
        except Exception as e:
            res["error"] = exc_info(e)
        res["seconds"] = time.monotonic() - t0
        ctx.event("raised")
    else:
        ctx.gate_wait("release-1")
    try:
        comm.close()
    except Exception as e:
        res["close"] = exc_info(e)
    return res


def prog_init_only(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """Ranks in args['skip'] never join; the others report what init() did."""
    if ctx.rank in args.get("skip", []):
        return {"rank": ctx.rank, "skipped": True}
    t0 = time.monotonic()
    res: dict[str, Any] = {"rank": ctx.rank}
    try:
        comm = ctx.init()
        res["error"] = None
        comm.close()
    except Exception as e:
        res["error"] = exc_info(e)
    res["seconds"] = time.monotonic() - t0
    return res


def prog_island_ops(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """Hierarchical ops recorded the way the hetobs_islands backend records them, without torch.

    Rank r is in island args['islands'][r] on device args['devices'][r] with library
    args['libraries'][r] (names only: no device is touched). Each op is one ExternalComm record (backend
    'islands'): a native all_reduce stands for the island's vendor collective, a copy for
    device->host and host->device, another all_reduce for the wire; their measured times
    are the op's phases. The last op stays in flight in its relay phase until gate
    'finish-<rank>' opens, so the test can dump and read the job meanwhile.
    """
    import hetobs
    from hetobs import _core
    from hetobs.buffers import DTYPES
    from hetobs.comm import OPS, REDUCTIONS

    comm = ctx.init()
    cid = int(args["comm_id"])
    device = args["devices"][ctx.rank]
    ext = _core.ExternalComm(cid, list(range(ctx.world)), ctx.rank, 4,  # 4: backend islands
                             {"cpu": 0, "cuda": 1}.get(device, 2), "islands:test", island=args["islands"][ctx.rank],
                             device_name=device, library=args["libraries"][ctx.rank])
    x = np.ones(4096, np.float32)
    codes = (OPS["all_reduce"], DTYPES["float32"], REDUCTIONS["sum"], -1, x.size, x.size, x.nbytes)

    def timed(fn: Callable[[], Any]) -> int:
        t0 = time.monotonic_ns()
        fn()
        return time.monotonic_ns() - t0

    sent = []
    for _ in range(int(args["ops"])):
        token = ext.begin(*codes)
        ext.set_phase(token, "vendor")
        vendor = timed(lambda: comm.all_reduce(x))
        ext.set_phase(token, "relay")
        host = x.copy()
        d2h = timed(lambda: np.copyto(host, x))
        wire = timed(lambda: comm.all_reduce(host))
        h2d = timed(lambda: np.copyto(x, host))
        ext.set_phase(token, "vendor")
        vendor += timed(lambda: comm.all_reduce(x))
        phases = {"vendor_ns": vendor, "d2h_ns": d2h, "wire_ns": wire, "h2d_ns": h2d, "chunks": 1}
        ext.end(token, True, phases=phases)
        sent.append(phases)
    token = ext.begin(*codes)
    ext.set_phase(token, "relay")
    ctx.event("in_flight", phases=sent, segment=_core.runtime_info()["stats_segment"])
    ctx.gate_wait(f"finish-{ctx.rank}")
    ext.end(token, True)
    records = [r for r in hetobs._core.records() if r["comm_id"] == cid]
    comm.close()
    return {"rank": ctx.rank, "phases": sent, "records": records}


def prog_job_identity(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """Join (MASTER_ADDR, or a torch TCPStore with args['store']), one all_reduce, report the
    job id the runtime runs under, then hold at gate release-<rank> so the test sees the job live."""
    import hetobs
    from hetobs import _core

    if args.get("store"):
        from datetime import timedelta

        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), ctx.world, ctx.rank == 0,
                              timeout=timedelta(seconds=30))
        comm = hetobs.init(store=store)
    else:
        comm = ctx.init()
    x = np.ones(8, np.float32)
    comm.all_reduce(x)
    info = _core.runtime_info()
    job = os.path.basename(info["job_dir"])
    ctx.event("joined", job=job, segment=info["stats_segment"], sum=float(x[0]))
    ctx.gate_wait(f"release-{ctx.rank}")
    comm.close()
    return {"rank": ctx.rank, "job": job}


def prog_inf_timeouts(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """2 ranks, run with HETOBS_HANG_TIMEOUT=inf and HETOBS_TIMEOUT=inf: rank 0 enters an
    all_reduce (event "entering") that rank 1 joins only once the test opens release-1, after
    it has seen watchdog ticks pass during rank 0's wait. Then per-op and Work.wait timeouts of inf."""
    comm = ctx.init()
    comm.barrier()
    x = np.ones(1000, np.float32)
    res: dict[str, Any] = {"rank": comm.rank, "errors": []}
    if comm.rank == 0:
        ctx.event("entering")
    else:
        ctx.gate_wait("release-1")
    try:
        comm.all_reduce(x)
        comm.all_reduce(x, timeout=float("inf"))
        w = comm.all_reduce(x, async_op=True, timeout=float("inf"))
        res["waited"] = w.wait(timeout=float("inf"))
    except Exception as e:
        res["errors"].append(exc_info(e))
    for bad in (float("nan"), -1.0):
        try:
            comm.all_reduce(x, timeout=bad)
            res["errors"].append({"accepted": repr(bad)})
        except ValueError as e:
            res.setdefault("refused", []).append(str(e))
    res["sum"] = float(x[0])
    comm.close()
    return res


def prog_selftest(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """The launcher's own test (no hetobs): events, gates, results, hangs, crashes."""
    ctx.event("started", pid=os.getpid())
    if ctx.rank in args.get("gate", []):
        ctx.gate_wait(f"g-{ctx.rank}")
        ctx.event("released")
    if ctx.rank in args.get("hang", []):
        while True:
            time.sleep(3600)  # stands in for a hung collective; the launcher's deadline kills it
    if ctx.rank in args.get("crash", []):
        raise RuntimeError(f"rank {ctx.rank} crashed on purpose")
    return {"rank": ctx.rank, "world": ctx.world, "env": {k: os.environ.get(k) for k in (
        "MASTER_ADDR", "MASTER_PORT", "HETOBS_JOB_ID", "HETOBS_TRANSPORT", "HETOBS_TIMEOUT",
        "HETOBS_CONNECT_TIMEOUT", "HETOBS_DIR")}}


def preparing_next_batch(seconds: float) -> None:
    """Stands for a rank busy in Python instead of in its next collective (diagnoses name it)."""
    time.sleep(seconds)


def prog_wait_chain(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """Waits that chain across communicators (issue 10), 4 ranks, culprit rank 3.

    shape "split": sub = split(color=rank % 2); rank 1 waits for rank 3 on their sub-communicator,
    ranks 0 and 2 go on to a world all_reduce and wait there. shape "chain3": groups [0, 1], [1, 2],
    [2, 3]; rank 0 waits on rank 1 in the first, rank 1 on rank 2 in the second, rank 2 on rank 3
    in the third. Just before its op rank 3 does `fault`: "sleep" (in Python), "kill" (SIGKILL) or
    "stop" (SIGSTOP). A warm-up op on every comm connects every link first, so a death shows as a
    closed connection. Event "armed" carries the comm ids, sent after a world barrier. A rank
    whose op fails reports "failed" and waits at gate "end" (the test makes it).
    """
    import signal

    comm = ctx.init()
    r = comm.rank
    x = np.ones(1024, np.float32)
    comm.all_reduce(x)
    if args["shape"] == "split":
        sub = comm.split(color=r % 2)
        assert sub is not None
        sub.all_reduce(x)
        plan = [comm] if r % 2 == 0 else [sub, comm]
        ids: dict[str, Any] = {"world": comm.id, "sub": sub.id}
    else:
        groups = [comm.new_group(g) for g in ([0, 1], [1, 2], [2, 3])]
        mine = [g for g in groups if g is not None]
        for g in mine:
            g.all_reduce(x)
        plan = list(reversed(mine))  # first the group shared with the next rank, which it waits on
        ids = {"groups": [g.id for g in mine]}
    comm.barrier()
    ctx.event("armed", ids=ids)
    if r == int(args.get("culprit", 3)):
        fault = args["fault"]
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            preparing_next_batch(float(args.get("sleep_s", 120)))
    try:
        for c in plan:
            c.all_reduce(x)
    except Exception as e:
        # Stay as the failure left this rank (alive, answering dump requests) until the test
        # opens gate "end": exiting would cascade into its peers and blur the incident.
        ctx.event("failed", error=exc_info(e))
        ctx.gate_wait("end")
        raise
    return {"rank": r, "ids": ids}
def preparing_next_batch_until_killed(ctx: Ctx) -> None:
    """Stands for a rank busy in Python instead of in the collective (the test kills it)."""
    ctx.event("sleeping")
    while True:
        time.sleep(3600)


def prog_two_peer_hang(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """A rank that waits on two peers at once (issue 30): 3 ranks run one all_to_all (every link
    connected), then ranks 1 and 2 stop themselves (SIGSTOP) and rank 0 calls the next
    all_to_all, which waits on both until the watchdog dumps and the test kills the job."""
    import signal

    comm = ctx.init()
    x = np.arange(3 * 256, dtype=np.float32)
    out = np.empty_like(x)
    comm.all_to_all(out, x)
    comm.barrier()
    ctx.event("armed")
    if comm.rank != 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        return {"rank": comm.rank, "unexpected": "resumed"}
    comm.all_to_all(out, x)
    return {"rank": comm.rank, "unexpected": "the all_to_all completed"}


def prog_sleep_hang(ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    """all_reduce in a loop; rank args['culprit'] goes to sleep in Python at op args['at'] while
    the others wait in that op until the watchdog dumps and the test kills the job."""
    culprit, at = int(args["culprit"]), int(args.get("at", 3))
    comm = ctx.init()
    x = np.ones(1024, np.float32)
    for i in range(at + 1):
        if i == at and comm.rank == culprit:
            preparing_next_batch_until_killed(ctx)
        if i == at:
            ctx.event("entering", seq=i)
        comm.all_reduce(x)
    return {"rank": comm.rank, "unexpected": "the op at the culprit's sleep completed"}


PROGRAMS: dict[str, Callable[[Ctx, dict[str, Any]], dict[str, Any]]] = {
    "collectives": prog_collectives,
    "random_mixed": prog_random_mixed,
    "api_errors": prog_api_errors,
    "kill_loop": prog_kill_loop,
    "auth": prog_auth,
    "mismatch": prog_mismatch,
    "timeout": prog_timeout,
    "async_timeout": prog_async_timeout,
    "init_only": prog_init_only,
    "job_identity": prog_job_identity,
    "inf_timeouts": prog_inf_timeouts,
    "selftest": prog_selftest,
    "island_ops": prog_island_ops,
    "relay": lambda ctx, args: __import__("relay_programs").run(ctx, args),  # tests/relay_programs.py
    "device_relay": lambda ctx, args: __import__("device_relay_programs").run(ctx, args),  # tests/device_relay_programs.py
    "strangers": lambda ctx, args: __import__("wire_programs").strangers(ctx, args),  # tests/wire_programs.py
    "fuzz_target": lambda ctx, args: __import__("wire_programs").fuzz_target(ctx, args),
    "wait_chain": prog_wait_chain,
    "sleep_hang": prog_sleep_hang,
    "two_peer_hang": prog_two_peer_hang,
    "single_copy": lambda ctx, args: __import__("single_copy_programs").run(ctx, args),  # tests/single_copy_programs.py
}


def _write_result(obj: dict[str, Any]) -> None:
    path = os.environ.get("HETOBS_TEST_RESULT")
    if not path:
        print(json.dumps(obj))
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, default=repr)
    os.replace(tmp, path)


def main() -> int:
    program, raw = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "{}")
    args = json.loads(raw)
    deadline = float(os.environ.get("HETOBS_TEST_DEADLINE", "120"))
    # A hung rank prints every thread's stack shortly before the launcher kills it: 1 s before
    # the job's deadline, counted from when the launcher started the job (CLOCK_MONOTONIC is
    # shared by processes), so a slow start-up on a loaded machine does not push it past the kill.
    t0 = float(os.environ.get("HETOBS_TEST_T0", time.monotonic()))
    faulthandler.dump_traceback_later(max(t0 + deadline - 1.0 - time.monotonic(), 0.1), exit=False)
    ctx = Ctx()
    if os.environ.get("HETOBS_TEST_START_BARRIER"):
        if program != "selftest":
            import hetobs  # noqa: F401
        if args.get("torch"):
            import torch  # noqa: F401
        ctx.event("ready")
        ctx.gate_wait(f"start-{ctx.rank}")
    try:
        result = PROGRAMS[program](ctx, args)
        rc = 0
    except BaseException as e:
        result = {"rank": ctx.rank, "exception": exc_info(e), "traceback": traceback.format_exc()}
        rc = 1
    _write_result(result)
    faulthandler.cancel_dump_traceback_later()
    return rc


if __name__ == "__main__":
    sys.exit(main())
