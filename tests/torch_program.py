"""One rank of the torch.distributed comparison (tests/test_torch_backends.py).

Runs the same collectives under whatever backend TORCH_BACKEND names and prints one
JSON line "RESULT {...}" with every result, plus "RECORDS [...]" with the hetobs op
records when hetobs is in the loop.
"""

import json
import os

import torch
import torch.distributed as dist

import hetobs

backend = os.environ["TORCH_BACKEND"]
dist.init_process_group(backend)
r, n = dist.get_rank(), dist.get_world_size()
out = {}
t = torch.arange(10, dtype=torch.float32) + r
dist.all_reduce(t)
out["all_reduce"] = t.tolist()
t = torch.arange(8, dtype=torch.float64) * (r + 1)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
out["all_reduce_max"] = t.tolist()
t = torch.full((5,), r + 2, dtype=torch.int32)
dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
out["all_reduce_prod_int"] = t.tolist()
o = torch.empty(4 * n)
dist.all_gather_into_tensor(o, torch.ones(4) * r)
out["all_gather_into_tensor"] = o.tolist()
lst = [torch.empty(3) for _ in range(n)]
dist.all_gather(lst, torch.ones(3) * r)
out["all_gather"] = [x.tolist() for x in lst]
rs = torch.empty(2)
dist.reduce_scatter_tensor(rs, torch.arange(2 * n, dtype=torch.float32) + r)
out["reduce_scatter_tensor"] = rs.tolist()
rs2 = torch.empty(2)
dist.reduce_scatter(rs2, [torch.ones(2) * (r + i) for i in range(n)])
out["reduce_scatter"] = rs2.tolist()
a2a = torch.empty(2 * n)
dist.all_to_all_single(a2a, torch.arange(2 * n, dtype=torch.float32) + 10 * r)
out["all_to_all_single"] = a2a.tolist()
outs = [torch.empty(2) for _ in range(n)]
dist.all_to_all(outs, [torch.ones(2) * (10 * r + i) for i in range(n)])
out["all_to_all"] = [x.tolist() for x in outs]
b = torch.arange(5, dtype=torch.float32) * (r == 1)
dist.broadcast(b, src=1)
out["broadcast"] = b.tolist()
rd = torch.ones(3) * (r + 1)
dist.reduce(rd, dst=0)
out["reduce"] = rd.tolist() if r == 0 else None
# Wrappers and Gloo only (tests/test_torch_backends.py WRAPPER_ONLY; what the native backend
# supports is issue 29's conformance list). Coalesced ops as FSDP and torch's own tests issue
# them (_coalescing_manager's fast path), gather, scatter, batched p2p, recv from any source.
def wrapper_only_ops() -> None:
    from torch.distributed.distributed_c10d import _coalescing_manager

    gl = [torch.empty(2) for _ in range(n)] if r == 2 else None
    dist.gather(torch.ones(2) * r, gl, dst=2)
    out["gather"] = [x.tolist() for x in gl] if gl is not None else None
    sc = torch.empty(2)
    dist.scatter(sc, [torch.ones(2) * (10 + i) for i in range(n)] if r == 3 else None, src=3)
    out["scatter"] = sc.tolist()
    outs = [torch.empty(2 * n) for _ in range(2)]
    with _coalescing_manager():
        for i, o in enumerate(outs):
            dist.all_gather_into_tensor(o, torch.full((2,), float(r + i)))
    out["all_gather_coalesced_fast"] = [o.tolist() for o in outs]
    outs = [torch.empty(1) for _ in range(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for i, o in enumerate(outs):
            dist.reduce_scatter_tensor(o, torch.arange(n, dtype=torch.float32) + r + i)
    cm.wait()
    out["reduce_scatter_coalesced_fast"] = [o.tolist() for o in outs]
    ts = [torch.ones(2) * (r + 1), torch.ones(3) * (r + 2)]
    with _coalescing_manager():
        for t in ts:
            dist.all_reduce(t)
    out["all_reduce_coalesced_fast"] = [t.tolist() for t in ts]
    lists = [[torch.empty(2), torch.empty(1)] for _ in range(n)]
    dist.all_gather_coalesced(lists, [torch.ones(2) * r, torch.ones(1) * -r])
    out["all_gather_coalesced"] = [[x.tolist() for x in li] for li in lists]
    got = torch.empty(2)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(r)), (r + 1) % n),
                                   dist.P2POp(dist.irecv, got, (r - 1) % n)])
    for q in reqs:
        q.wait()
    out["batch_isend_irecv"] = got.tolist()
    dist.barrier()
    if r == 3:
        dist.send(torch.full((2,), 7.0), 0)
    elif r == 0:
        anyone = torch.empty(2)
        out["recv_anysource_from"] = dist.recv(anyone)
        out["recv_anysource"] = anyone.tolist()


if backend != "hetobs":
    wrapper_only_ops()
dist.barrier()
if r == 0:
    dist.send(torch.arange(3, dtype=torch.float32), 1)
elif r == 1:
    x = torch.empty(3)
    dist.recv(x, 0)
    out["send_recv"] = x.tolist()
w = dist.all_reduce(torch.ones(2) * r, async_op=True)
w.wait()
out["async_done"] = w.is_completed()
# Completed through the future alone (as DDP does): the record must still end.
fut = dist.all_reduce(torch.ones(2) * r, async_op=True).get_future()
out["future_only"] = [t.tolist() for t in fut.wait()]
# Async point-to-point in a ring, and an async reduce_scatter (no future under Gloo).
sent, got = torch.full((2,), float(r)), torch.empty(2)
works = [dist.isend(sent, (r + 1) % n), dist.irecv(got, (r - 1) % n)]
rs3 = torch.empty(1)
works.append(dist.reduce_scatter_tensor(rs3, torch.arange(n, dtype=torch.float32) + r, async_op=True))
for w in works:
    w.wait()
out["ring"], out["reduce_scatter_async"] = got.tolist(), rs3.tolist()
g = dist.new_group([0, 2])
if r in (0, 2):
    t = torch.ones(3) * r
    dist.all_reduce(t, group=g)
    out["new_group"] = t.tolist()
big = torch.arange(300000, dtype=torch.float32) * (r + 1)
dist.all_reduce(big)
out["big_sum"] = float(big.sum())
print("RESULT " + json.dumps(out, sort_keys=True), flush=True)
if backend == "hetobs_gloo":
    cpu = dist.group.WORLD._get_backend(torch.device("cpu")) if hetobs.torch.native_wrapper() else None
    print("WRAPPER " + ("native" if cpu is not None and cpu.name() == "hetobs_gloo" else "python"), flush=True)
if backend != "gloo":
    recs = [{k: v[k] for k in ("op", "count", "bytes", "backend", "busbw_gbps", "state", "comm_id")}
            for v in hetobs.records()]
    print("RECORDS " + json.dumps(recs), flush=True)
dist.destroy_process_group()
