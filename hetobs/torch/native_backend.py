"""`dist.init_process_group("hetobs")`: torch.distributed over the hetobs native transport.

A Python ProcessGroup (torch 2.13 dispatches every collective to it, including
all_gather_single / reduce_scatter_single / all_to_all_single). Each group gets its own
native communicator, rendezvoused through the store torch hands the backend; its ops
land in the recorder, watchdog and dumps like any native op. Ops run to completion
before the call returns (async_op=True gets an already-completed Work). A `timeout` given
to init_process_group or new_group is each op's (HETOBS_TIMEOUT otherwise).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .. import _connect_through_store, _endpoint
from ..comm import Communicator
from ._common import comm_id_for, done, reduction, staged
from .python_group import PythonGroup, group_timeout, or_default

__all__ = ["HetobsBackend", "create"]


class HetobsBackend(PythonGroup, dist.ProcessGroup):
    def __init__(self, comm: Communicator) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm = comm

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "hetobs"

    # -- collectives ------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = reduction(or_default(opts, dist.AllreduceOptions).reduceOp)
        for t in tensors:
            with staged(t) as h:
                self.comm.all_reduce(h, op)
        return done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = or_default(opts, dist.BroadcastOptions)
        for t in tensors:
            with staged(t) as h:
                self.comm.broadcast(h, opts.rootRank)
        return done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = or_default(opts, dist.ReduceOptions)
        op = reduction(opts.reduceOp)
        for t in tensors:
            with staged(t) as h:
                self.comm.reduce(h, opts.rootRank, op)
        return done(tensors)

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        with staged(inp, copy_out=False) as hi, staged(out, copy_in=False) as ho:
            self.comm.all_gather(ho, hi)
        return done([out])

    _allgather_base = all_gather_single

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        for outs, inp in zip(outputs, inputs, strict=True):
            if inp.numel() == 0:  # every rank's is empty (equal shapes): nothing to move
                continue
            flat = torch.empty(self.comm.size * inp.numel(), dtype=inp.dtype)
            with staged(inp, copy_out=False) as hi:
                self.comm.all_gather(flat, hi)
            for i, o in enumerate(outs):
                o.copy_(flat[i * inp.numel():(i + 1) * inp.numel()].view_as(o))
        return done(outputs)

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        op = reduction(or_default(opts, dist.ReduceScatterOptions).reduceOp)
        with staged(inp, copy_out=False) as hi, staged(out, copy_in=False) as ho:
            self.comm.reduce_scatter(ho, hi, op)
        return done([out])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        op = reduction(or_default(opts, dist.ReduceScatterOptions).reduceOp)
        for out, ins in zip(outputs, inputs, strict=True):
            flat = torch.cat([t.detach().to("cpu").reshape(-1) for t in ins])
            with staged(out, copy_in=False) as ho:
                self.comm.reduce_scatter(ho, flat, op)
        return done(outputs)

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                          in_splits: list[int], opts: Any = None) -> Any:
        n = self.comm.size
        even_in = not in_splits or len(set(in_splits)) == 1 and in_splits[0] * n == inp.shape[0]
        even_out = not out_splits or len(set(out_splits)) == 1 and out_splits[0] * n == out.shape[0]
        if not (even_in and even_out):
            raise ValueError("hetobs all_to_all_single takes equal splits only (got "
                             f"input splits {in_splits}, output splits {out_splits})")
        with staged(inp, copy_out=False) as hi, staged(out, copy_in=False) as ho:
            self.comm.all_to_all(ho, hi)
        return done([out])

    _alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        flat_in = torch.cat([t.detach().to("cpu").reshape(-1) for t in inputs])
        flat_out = torch.empty_like(flat_in)
        self.comm.all_to_all(flat_out, flat_in)
        off = 0
        for o in outputs:
            o.copy_(flat_out[off:off + o.numel()].view_as(o))
            off += o.numel()
        return done(outputs)

    def barrier(self, opts: Any = None) -> Any:
        self.comm.barrier()
        return done()

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        for t in tensors:
            with staged(t, copy_out=False) as h:
                self.comm.send(h, dst)
        return done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        for t in tensors:
            with staged(t, copy_in=False) as h:
                self.comm.recv(h, src)
        return done(tensors)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        root, me = or_default(opts, dist.GatherOptions).rootRank, self.comm.rank
        for i, inp in enumerate(inputs):
            with staged(inp, copy_out=False) as hi:
                if me != root:
                    self.comm.send(hi, root)
                    continue
                for r, o in enumerate(outputs[i]):
                    if r == me:
                        o.copy_(hi)
                    else:
                        with staged(o, copy_in=False) as ho:
                            self.comm.recv(ho, r)
        return done(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        root, me = or_default(opts, dist.ScatterOptions).rootRank, self.comm.rank
        for i, out in enumerate(outputs):
            with staged(out, copy_in=False) as ho:
                if me != root:
                    self.comm.recv(ho, root)
                    continue
                for r, t in enumerate(inputs[i]):
                    if r == me:
                        ho.copy_(t)
                    else:
                        with staged(t, copy_out=False) as ht:
                            self.comm.send(ht, r)
        return done(outputs)


def create(opts: Any, backend_options: Any = None) -> HetobsBackend:
    """torch's extended-API creator: one native communicator per torch group."""
    rank, size = int(opts.group_rank), int(opts.group_size)
    world_ranks = list(opts.global_ranks_in_group)
    endpoint = _endpoint(rank, size, group_timeout(opts.timeout))
    if not world_ranks:  # the default group: this is the job's world
        native = _connect_through_store(endpoint, opts.store, "hetobs/card/", rank, size)
    else:
        native = _connect_through_store(endpoint, opts.store, "hetobs/card/", rank, size,
                                        comm_id=comm_id_for(str(opts.group_id)), world_ranks=world_ranks)
    return HetobsBackend(Communicator(native))
