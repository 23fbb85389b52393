"""The collective library inside one island, behind one small interface.

An island runs its own vendor library (Gloo, NCCL, HCCL, ... or hetobs's native
transport). `IslandGroup` hides which: every method runs one collective among the
island's members to completion, takes island-local ranks, and returns the ns it spent
(the "vendor" phase of the hierarchical op). Torch backends are instrumented with
hetobs's wrapper, so their ops land in the recorder under their own communicator
(backend gloo/nccl) and a rank stuck inside the vendor library is dumped with what the
wrapper recorded.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, _DistributedBackendOptions

from .. import codes
from ..comm import Communicator
from ..torch._common import comm_id_for, reduction
from .topology import IslandError, Topology

__all__ = ["IslandGroup", "TorchIslandGroup", "NativeIslandGroup", "cheap_scatter", "device_code", "make_island_group"]

# Backend codes of records (csrc/include/hetobs/record/op_record.h): Gloo and NCCL by
# name, every other library (HCCL, XCCL, ... through its torch plugin) as "vendor", its
# name in the communicator's name.
_INSTRUMENTED = {name: codes.BACKEND_CODES[name] for name in ("gloo", "nccl")}
_VENDOR_CODE = codes.BACKEND_CODES["vendor"]
# Libraries whose reduce-scatter and all-gather cost about twice their all-reduce, measured
# (docs/islands.md): hierarchical ops avoid them and move whole buffers over the relay.
_COSTLY_SCATTER = {"gloo"}


def device_code(device: str) -> int:
    """A record's device code (record/op_record.h DeviceType): cpu, cuda, else "other" (the
    record's device name says which)."""
    return codes.DEVICE_CODES.get(device, codes.DEVICE_CODES["other"])


def cheap_scatter(backend: str) -> bool:
    """Whether `backend`'s reduce-scatter + all-gather cost about what its all-reduce does
    (NCCL, HCCL, hetobs), so a hierarchical op may use them to relay one block per rank."""
    return backend not in _COSTLY_SCATTER


class IslandGroup:
    """One island's collectives; ranks are island ranks. Each call returns its ns."""

    size: int
    rank: int

    def all_reduce(self, t: torch.Tensor, op: Any) -> int: raise NotImplementedError
    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any) -> int: raise NotImplementedError
    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> int: raise NotImplementedError
    def broadcast(self, t: torch.Tensor, root: int) -> int: raise NotImplementedError
    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                   in_splits: list[int]) -> int: raise NotImplementedError
    def barrier(self) -> int: raise NotImplementedError
    def send(self, t: torch.Tensor, peer: int) -> int: raise NotImplementedError
    def recv(self, t: torch.Tensor, peer: int) -> int: raise NotImplementedError
    def shutdown(self) -> None: pass


def _timed(work: Any, t0: int) -> int:
    work.wait()
    return time.perf_counter_ns() - t0


class TorchIslandGroup(IslandGroup):
    """A c10d backend (Gloo, NCCL, a vendor plugin), optionally instrumented by hetobs."""

    def __init__(self, backend: Any, rank: int, size: int) -> None:
        self.b, self.rank, self.size = backend, rank, size

    def all_reduce(self, t: torch.Tensor, op: Any) -> int:
        o = dist.AllreduceOptions()
        o.reduceOp = op
        t0 = time.perf_counter_ns()
        return _timed(self.b.allreduce([t], o), t0)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any) -> int:
        o = dist.ReduceScatterOptions()
        o.reduceOp = op
        t0 = time.perf_counter_ns()
        return _timed(self.b._reduce_scatter_base(out, inp, o), t0)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> int:
        t0 = time.perf_counter_ns()
        return _timed(self.b._allgather_base(out, inp, AllgatherOptions()), t0)

    def broadcast(self, t: torch.Tensor, root: int) -> int:
        o = dist.BroadcastOptions()
        o.rootRank = root
        t0 = time.perf_counter_ns()
        return _timed(self.b.broadcast([t], o), t0)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> int:
        call = getattr(self.b, "alltoall_base", None) or self.b._alltoall_base  # C++ Backend / Python fallback
        t0 = time.perf_counter_ns()
        return _timed(call(out, inp, out_splits, in_splits, dist.AllToAllOptions()), t0)

    def barrier(self) -> int:
        t0 = time.perf_counter_ns()
        return _timed(self.b.barrier(dist.BarrierOptions()), t0)

    def send(self, t: torch.Tensor, peer: int) -> int:
        t0 = time.perf_counter_ns()
        return _timed(self.b.send([t], peer, 0), t0)

    def recv(self, t: torch.Tensor, peer: int) -> int:
        t0 = time.perf_counter_ns()
        return _timed(self.b.recv([t], peer, 0), t0)

    def shutdown(self) -> None:
        shutdown = getattr(self.b, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self.b = None


class NativeIslandGroup(IslandGroup):
    """hetobs's own transport inside the island (HETOBS_ISLAND_BACKEND=hetobs): host tensors."""

    def __init__(self, comm: Communicator) -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    def _go(self, call: Any, *args: Any) -> int:
        t0 = time.perf_counter_ns()
        call(*args)
        return time.perf_counter_ns() - t0

    def all_reduce(self, t: torch.Tensor, op: Any) -> int:
        return self._go(self.comm.all_reduce, t, reduction(op))

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any) -> int:
        return self._go(self.comm.reduce_scatter, out, inp, reduction(op))

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> int:
        return self._go(self.comm.all_gather, out, inp)

    def broadcast(self, t: torch.Tensor, root: int) -> int:
        return self._go(self.comm.broadcast, t, root)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> int:
        if len(set(in_splits)) > 1 or len(set(out_splits)) > 1:
            # The native all_to_all moves equal blocks; uneven ones go pairwise.
            t0 = time.perf_counter_ns()
            self._pairwise(out, inp, out_splits, in_splits)
            return time.perf_counter_ns() - t0
        return self._go(self.comm.all_to_all, out, inp)

    def _pairwise(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> None:
        # One relay op: every block moves at once, so no ordering of sends can deadlock.
        n, me = self.size, self.rank
        ioff = [sum(in_splits[:p]) for p in range(n)]
        ooff = [sum(out_splits[:p]) for p in range(n)]
        out[ooff[me]:ooff[me] + out_splits[me]].copy_(inp[ioff[me]:ioff[me] + in_splits[me]])
        sends = [(p, inp[ioff[p]:ioff[p] + in_splits[p]]) for p in range(n) if p != me and in_splits[p]]
        recvs = [(p, out[ooff[p]:ooff[p] + out_splits[p]]) for p in range(n) if p != me and out_splits[p]]
        self.comm.relay(sends, recvs)

    def barrier(self) -> int:
        return self._go(self.comm.barrier)

    def send(self, t: torch.Tensor, peer: int) -> int:
        return self._go(self.comm.send, t, peer)

    def recv(self, t: torch.Tensor, peer: int) -> int:
        return self._go(self.comm.recv, t, peer)


def _plugin_backend(name: str, store: Any, rank: int, size: int, timeout: timedelta, group_id: str,
                    world_ranks: list[int]) -> Any:
    """A backend registered with torch.distributed by a vendor plugin (torch_npu's hccl, ...)."""
    plugin = dist.Backend._plugins.get(name.upper())
    if plugin is None:
        raise IslandError(f"HETOBS_ISLAND_BACKEND={name!r}: torch.distributed has no such backend here "
                          "(is the vendor's torch plugin imported before init_process_group?)")
    if plugin.extended_api:
        opts = _DistributedBackendOptions()
        opts.store, opts.group_rank, opts.group_size, opts.timeout = store, rank, size, timeout
        opts.group_id, opts.global_ranks_in_group = group_id, world_ranks
        return plugin.creator_fn(opts, None)
    return plugin.creator_fn(store, rank, size, timeout)


def make_island_group(topo: Topology, rank: int, store: Any, timeout: timedelta, group_id: str,
                      world_ranks: list[int], relay_world: Communicator) -> IslandGroup:
    """Create this rank's island group; collective over the whole group (every rank calls it)."""
    island = topo.of(rank)
    rank_in_island = island.rank_of(rank)
    members = [world_ranks[m] for m in island.members]
    if any(i.backend == "hetobs" for i in topo.islands):
        # Native islands are sub-communicators of the relay world (no second rendezvous);
        # split() is collective over the world, so ranks of other islands take part too.
        joins = island.backend == "hetobs"
        sub = relay_world.split(color=island.index if joins else -1, key=rank_in_island)
        if joins:
            if sub is None:  # color >= 0 always joins: a None here is a bug, not a user error
                raise RuntimeError(f"island {island.name!r}: the native split returned no communicator")
            return NativeIslandGroup(sub)
    vendor_store = dist.PrefixStore(f"hetobs-islands/{island.name}/", store)
    n = island.size
    if island.backend == "gloo":
        inner: Any = dist.ProcessGroupGloo(vendor_store, rank_in_island, n, timeout)
    elif island.backend == "nccl":
        inner = dist.ProcessGroupNCCL(vendor_store, rank_in_island, n, dist.ProcessGroupNCCL.Options())
    else:
        inner = _plugin_backend(island.backend, vendor_store, rank_in_island, n, timeout,
                                f"{group_id}:island:{island.name}", members)
    from .. import _core

    code = _INSTRUMENTED.get(island.backend, _VENDOR_CODE)
    ext = _core.ExternalComm(comm_id_for(f"island:{group_id}:{island.name}"), members, rank_in_island, code,
                             device_code(island.device), f"{island.backend}:island:{island.name}",
                             device_name=island.device, library=island.backend)
    return TorchIslandGroup(_instrumented(inner, ext, island.backend), rank_in_island, n)


def _instrumented(inner: Any, ext: Any, backend: str) -> Any:
    """The island's library behind hetobs's wrapper, so a rank stuck inside it is dumped with
    the op it waits in: the C++ wrapper where the library is a c10d C++ Backend (Gloo, NCCL,
    torch_npu's HCCL), else the Python one (a plugin written in Python)."""
    from ..torch.python_wrapper import InstrumentedBackend
    from ..torch.wrapped_backend import _instrument

    try:
        return _instrument(inner, ext, backend)
    except TypeError:  # pybind11: not a c10d::Backend
        return InstrumentedBackend(inner, ext, f"hetobs_{backend}")
