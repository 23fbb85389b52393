"""One rank of the islands correctness check (tests/test_islands.py).

Every rank knows every rank's inputs (a function of the rank), so each rank checks its
own results against numpy, for every op, dtype and reduction, at sizes that do and do
not divide by the islands' sizes. Prints "RESULT {...}": the failures (empty when all
is well), a digest of every result (ranks of all islands must agree bit for bit), and
the records of the islands communicator.

A rank whose island is on a device (HETOBS_ISLAND_DEVICE, e.g. the stand-in accelerator
"standin" of hetobs_standin) makes its tensors there: every op then crosses device memory,
and results are copied back to the host to be checked.
"""

import hashlib
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import hetobs

if os.environ.get("TEST_WITHOUT_TORCH_EXT") == "1":
    sys.modules["hetobs._torch_ext"] = None  # as where it was built for another torch: the Python fallbacks
DEVICE = os.environ.get("HETOBS_ISLAND_DEVICE", "cpu")
if DEVICE == "standin":
    import hetobs_standin  # noqa: F401  (registers the stand-in device and its library sccl)


def on(t: torch.Tensor) -> torch.Tensor:
    """`t` on this rank's island device."""
    return t.to(DEVICE)


dist.init_process_group("hetobs_islands")
r, n = dist.get_rank(), dist.get_world_size()
failures: list[str] = []
digest = hashlib.sha256()
issued = {"collective": 0, "p2p": 0}  # ops this rank called, to check against its records


class counted:
    """dist.<op> that counts each call (send/recv as p2p)."""

    def __getattr__(self, name: str):
        fn = getattr(dist, name)

        def call(*a, **kw):
            issued["p2p" if name in ("send", "recv") else "collective"] += 1
            return fn(*a, **kw)
        return call


op_ = counted()

DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
          "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
FOLD = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "avg": np.mean}
SIZES = [0, 1, 7, 1000, 65537]


def value(rank: int, count: int, op: str) -> np.ndarray:
    i = np.arange(count)
    if op == "prod":
        return ((i + rank) % 2 + 1).astype(np.float64)   # products of 1s and 2s stay exact
    return ((i * 7 + rank * 3) % 11).astype(np.float64)  # sums stay small and exact


def check(name: str, got: torch.Tensor, want: np.ndarray, *, everywhere: bool = False) -> None:
    got = got.cpu()
    if everywhere:  # a result every rank holds: its bytes must agree across islands
        digest.update(name.encode())
        digest.update(got.view(torch.uint8).numpy().tobytes() if got.numel() else b"")
    mine = got.to(torch.float64).numpy()
    if mine.shape != want.shape or not np.array_equal(mine, want):
        bad = np.flatnonzero(mine != want)[:3] if mine.shape == want.shape else "shape"
        failures.append(f"{name}: got {mine[:4].tolist()} want {want[:4].tolist()} (first bad {bad})")


def as_dtype(a: np.ndarray, dt: torch.dtype) -> np.ndarray:
    return torch.from_numpy(a).to(dt).to(torch.float64).numpy()  # what the dtype can hold


for dname, dt in DTYPES.items():
    for oname, op in OPS.items():
        if oname == "avg" and not dt.is_floating_point:
            continue
        for count in SIZES:
            t = on(torch.from_numpy(value(r, count, oname)).to(dt))
            op_.all_reduce(t, op=op)
            ins = np.stack([value(q, count, oname) for q in range(n)]) if count else np.zeros((n, 0))
            want = as_dtype(FOLD[oname](ins, axis=0) if count else np.zeros(0), dt)
            check(f"all_reduce {dname} {oname} {count}", t, want, everywhere=True)

for dname, dt in DTYPES.items():
    for count in (0, 1, 5, 4099):
        x = on(torch.from_numpy(value(r, count, "sum")).to(dt))
        out = on(torch.empty(n * count, dtype=dt))
        op_.all_gather_single(out, x)
        check(f"all_gather {dname} {count}", out,
              as_dtype(np.concatenate([value(q, count, "sum") for q in range(n)]), dt), everywhere=True)
        for root in range(n):
            b = on(torch.from_numpy(value(r, count, "sum")).to(dt))
            op_.broadcast(b, src=root)
            check(f"broadcast {dname} {count} root {root}", b, as_dtype(value(root, count, "sum"), dt), everywhere=True)
        whole = on(torch.from_numpy(value(r, n * count, "sum")).to(dt))
        rs = on(torch.empty(count, dtype=dt))
        op_.reduce_scatter_single(rs, whole)
        total = np.sum([value(q, n * count, "sum") for q in range(n)], axis=0)
        check(f"reduce_scatter {dname} {count}", rs, as_dtype(total[r * count:(r + 1) * count], dt))
        a2a_in = on(torch.from_numpy(value(r, n * count, "sum") + 20 * r).to(dt))
        a2a = on(torch.empty(n * count, dtype=dt))
        op_.all_to_all_single(a2a, a2a_in)
        want = np.concatenate([(value(q, n * count, "sum") + 20 * q)[r * count:(r + 1) * count] for q in range(n)])
        check(f"all_to_all {dname} {count}", a2a, as_dtype(want, dt))

# Uneven all_to_all: rank q sends (q + p) % 3 + 1 rows of 2 elements to rank p.
rows = lambda q, p: (q + p) % 3 + 1  # noqa: E731
send = on(torch.cat([torch.full((rows(r, p), 2), float(100 * r + p)) for p in range(n)]))
recv = on(torch.empty(sum(rows(q, r) for q in range(n)), 2))
op_.all_to_all_single(recv, send, [rows(q, r) for q in range(n)], [rows(r, p) for p in range(n)])
check("all_to_all uneven", recv.reshape(-1),
      np.concatenate([np.full(rows(q, r) * 2, 100.0 * q + r) for q in range(n)]))

# Lists, reduce, gather, scatter, barrier, point-to-point within and across islands.
lst = [on(torch.empty(3)) for _ in range(n)]
op_.all_gather(lst, on(torch.full((3,), float(r))))
check("all_gather list", torch.cat([x.cpu() for x in lst]), np.repeat(np.arange(n, dtype=np.float64), 3))
rd = on(torch.full((4,), float(r + 1)))
op_.reduce(rd, dst=n - 1)
check("reduce", rd, np.full(4, n * (n + 1) / 2) if r == n - 1 else np.full(4, float(r + 1)))
op_.barrier()
for src in range(n):
    for dst in range(n):
        if src == dst:
            continue
        if r == src:
            op_.send(on(torch.full((6,), float(10 * src + dst))), dst)
        elif r == dst:
            x = on(torch.empty(6))
            op_.recv(x, src)
            check(f"send_recv {src}->{dst}", x, np.full(6, float(10 * src + dst)))
# Float sums of random values: within rounding of the exact sum, identical on every rank.
rng = np.random.default_rng(r)
f = on(torch.from_numpy(rng.standard_normal(100003)))
exact = np.sum([np.random.default_rng(q).standard_normal(100003) for q in range(n)], axis=0)
op_.all_reduce(f)
f = f.cpu()
digest.update(f.numpy().tobytes())
if not np.allclose(f.numpy(), exact, rtol=1e-12, atol=1e-12):
    failures.append("float64 random sum outside rounding")

recs = [x for x in hetobs.records() if x.get("backend") == "islands"]
print("RESULT " + json.dumps({"failures": failures, "digest": digest.hexdigest(), "issued": issued,
                              "ops": len(recs), "islands": sorted({x.get("island", "") for x in recs}),
                              "seqs": [x["collective_seq_id"] for x in recs if x["op"] not in ("send", "recv")],
                              "phased": sum(1 for x in recs if x["phases"] and x["phases"]["vendor_ns"] + x["phases"]["wire_ns"] > 0),
                              "states": sorted({x["state"] for x in recs}),
                              "devices": sorted({x["device_type"] for x in recs}),
                              "libraries": sorted({x["library"] for x in recs}),
                              "relay_devices": sorted({x["device_type"] for x in hetobs.records() if x["op"] == "relay"})}),
      flush=True)
dist.destroy_process_group()
