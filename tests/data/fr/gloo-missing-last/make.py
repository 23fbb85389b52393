"""Real Gloo Flight Recorder dumps: 3 ranks; ranks 0 and 1 enter all_reduce #5, rank 2 has not yet."""
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, ws, d):
    dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=rank, world_size=ws)
    t = torch.ones(16)
    for i in range(4):
        dist.all_reduce(t)
    dist.barrier()
    work = None
    if rank != 2:
        work = dist.all_reduce(t, async_op=True)
    dist.new_group([0, 1, 2])  # no-op sync point is not allowed mid-collective; just dump
    js = torch._C._distributed_c10d._dump_fr_trace_json(True, True)
    pk = torch._C._distributed_c10d._dump_fr_trace(True, True)
    os.makedirs(f"{d}/json", exist_ok=True); os.makedirs(f"{d}/pickle", exist_ok=True)
    open(f"{d}/json/gloo_trace_rank_{rank}", "w").write(js if isinstance(js, str) else js.decode())
    open(f"{d}/pickle/gloo_trace_rank_{rank}", "wb").write(pk)
    if rank == 2:
        dist.all_reduce(t)
    else:
        work.wait()
    dist.destroy_process_group()
if __name__ == "__main__":
    d = sys.argv[1]; os.makedirs(d, exist_ok=True)
    mp.spawn(run, args=(3, d), nprocs=3)
