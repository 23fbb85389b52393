"""`dist.init_process_group("hetobs_islands")`: one job across islands of different
accelerators and collective libraries.

Each rank's island and library come from HETOBS_ISLAND / HETOBS_ISLAND_BACKEND
(topology.py). The group is a Python ProcessGroup whose collectives are hierarchical
(hierarchical.py): the vendor library inside each island, hetobs's pipelined host relay
between islands. Each op is recorded once, in this group's communicator (backend
"islands"), with one (comm, seq) on every rank of every island, the rank's island, and
the time of each phase; the vendor ops inside and the relay ops between land in their
own communicators, so a hang is dumped with the phase and the library it is in.
Ops run to completion before the call returns (async_op=True gets a completed Work).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _connect_through_store, _core, _endpoint, codes
from ..comm import OPS, Communicator
from ..torch._common import DTYPE_CODES, comm_id_for, done, reduction_code, require_dense
from ..torch.python_group import PythonGroup, group_timeout, or_default
from . import hierarchical as hier
from .relay import PhaseClock, Relay, relay_pipelined, relay_stage
from .topology import exchange
from .vendor import device_code, make_island_group

__all__ = ["IslandsBackend", "create"]

log = logging.getLogger("hetobs")

ISLANDS_BACKEND_CODE = codes.BACKEND_CODES["islands"]


class IslandsBackend(PythonGroup, dist.ProcessGroup):
    def __init__(self, rank: int, size: int, h: hier.Hierarchy, ext: Any, relay_world: Communicator) -> None:
        super().__init__(rank, size)
        self.h, self._ext, self._relay_world = h, ext, relay_world

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "hetobs_islands"

    def shutdown(self) -> None:
        self.h.inner.shutdown()

    # -- recording ---------------------------------------------------------------------
    # run(clock): Callable[..., None], as the callers' lambdas bind their buffer as a default argument
    def _op(self, name: str, t: torch.Tensor | None, run: Callable[..., None], *, redop: Any = None,
            peer: int = -1, count: int | None = None, out_count: int | None = None,
            out: torch.Tensor | None = None) -> None:
        for x in (t, out):
            if x is not None and x.device.type != self.h.island.device:
                isl = self.h.island
                raise ValueError(f"hetobs_islands {name}: rank {self.rank()} is in island {isl.name!r} ({isl.backend} "
                                 f"on {isl.device}): its tensors must be {isl.device} tensors, got one on {x.device}")
        n = int(t.numel()) if t is not None else 0
        count = n if count is None else count
        out_count = count if out_count is None else out_count
        esize = t.element_size() if t is not None else 0
        token = self._ext.begin(OPS[name], DTYPE_CODES.get(t.dtype, 0) if t is not None else 0,
                                reduction_code(redop) if redop is not None else 0, peer, count, out_count,
                                max(count, out_count) * esize)
        clock = PhaseClock(lambda phase: self._ext.set_phase(token, phase))
        try:
            run(clock)
        except Exception as e:
            self._ext.end(token, False, f"{type(e).__name__}: {e}"[:90], phases=clock.as_dict())
            raise
        self._ext.end(token, True, phases=clock.as_dict())

    # -- collectives ---------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = or_default(opts, dist.AllreduceOptions)
        for t in tensors:
            with _flat(t) as f:
                self._op("all_reduce", t, lambda c, f=f: hier.all_reduce(self.h, c, f, opts.reduceOp),
                         redop=opts.reduceOp)
        return done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        root = int(or_default(opts, dist.BroadcastOptions).rootRank)
        for t in tensors:
            with _flat(t) as f:
                self._op("broadcast", t, lambda c, f=f: hier.broadcast(self.h, c, f, root), peer=root)
        return done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = or_default(opts, dist.ReduceOptions)
        root = int(opts.rootRank)
        for t in tensors:
            # The result on the root; other ranks' tensors are left as they were (as Gloo does).
            with _flat(t, copy_out=self.rank() == root) as f:
                work = f if self.rank() == root else f.clone()
                self._op("reduce", t, lambda c, w=work: hier.all_reduce(self.h, c, w, opts.reduceOp),
                         redop=opts.reduceOp, peer=root)
        return done(tensors)

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        _check(out.numel() == inp.numel() * self.size(), "all_gather output", out, inp, self.size())
        with _flat(inp, copy_out=False) as fi, _flat(out, copy_in=False) as fo:
            self._op("all_gather", inp, lambda c: hier.all_gather(self.h, c, fo, fi), out_count=out.numel(), out=out)
        return done([out])

    _allgather_base = all_gather_single

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        for outs, inp in zip(outputs, inputs, strict=True):
            flat = torch.empty(self.size() * inp.numel(), dtype=inp.dtype, device=inp.device)
            self.all_gather_single(flat, inp, opts)
            for i, o in enumerate(outs):
                o.copy_(flat[i * inp.numel():(i + 1) * inp.numel()].view_as(o))
        return done(outputs)

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        opts = or_default(opts, dist.ReduceScatterOptions)
        _check(inp.numel() == out.numel() * self.size(), "reduce_scatter input", inp, out, self.size())
        with _flat(inp, copy_out=False) as fi, _flat(out, copy_in=False) as fo:
            self._op("reduce_scatter", inp, lambda c: hier.reduce_scatter(self.h, c, fo, fi, opts.reduceOp),
                     redop=opts.reduceOp, out_count=out.numel(), out=out)
        return done([out])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        for out, ins in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(out, torch.cat([t.reshape(-1) for t in ins]), opts)
        return done(outputs)

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                          in_splits: list[int], opts: Any = None) -> Any:
        n = self.size()
        in_rows = _rows(inp, in_splits, n, "input")
        out_rows = _rows(out, out_splits, n, "output")
        ie = inp[0].numel() if inp.dim() and inp.shape[0] else 1
        oe = out[0].numel() if out.dim() and out.shape[0] else 1
        with _flat(inp, copy_out=False) as fi, _flat(out, copy_in=False) as fo:
            self._op("all_to_all", inp, lambda c: hier.all_to_all(self.h, c, fo, fi, [r * oe for r in out_rows],
                                                                  [r * ie for r in in_rows]),
                     out_count=out.numel(), out=out)
        return done([out])

    _alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        flat_out = torch.empty(sum(o.numel() for o in outputs), dtype=flat_in.dtype, device=flat_in.device)
        self._op("all_to_all", flat_in, lambda c: hier.all_to_all(self.h, c, flat_out, flat_in,
                                                                  [o.numel() for o in outputs],
                                                                  [t.numel() for t in inputs]),
                 out_count=flat_out.numel())
        off = 0
        for o in outputs:
            o.copy_(flat_out[off:off + o.numel()].view_as(o))
            off += o.numel()
        return done(outputs)

    def barrier(self, opts: Any = None) -> Any:
        self._op("barrier", None, lambda c: hier.barrier(self.h, c))
        return done()

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        for t in tensors:
            with _flat(t, copy_out=False) as f:
                self._op("send", t, lambda c, f=f: hier.send(self.h, c, f, dst), peer=dst)
        return done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        for t in tensors:
            with _flat(t, copy_in=False) as f:
                self._op("recv", t, lambda c, f=f: hier.recv(self.h, c, f, src), peer=src)
        return done(tensors)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        root = int(or_default(opts, dist.GatherOptions).rootRank)
        for i, inp in enumerate(inputs):
            flat = torch.empty(self.size() * inp.numel(), dtype=inp.dtype, device=inp.device)
            self.all_gather_single(flat, inp, opts)
            if self.rank() == root:
                for r, o in enumerate(outputs[i]):
                    o.copy_(flat[r * inp.numel():(r + 1) * inp.numel()].view_as(o))
        return done(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        root = int(or_default(opts, dist.ScatterOptions).rootRank)
        for i, out in enumerate(outputs):
            whole = (torch.cat([t.reshape(-1) for t in inputs[i]]) if self.rank() == root else
                     torch.empty(self.size() * out.numel(), dtype=out.dtype, device=out.device))
            bo = dist.BroadcastOptions()
            bo.rootRank = root
            self.broadcast([whole], bo)
            out.view(-1).copy_(whole[self.rank() * out.numel():(self.rank() + 1) * out.numel()])
        return done(outputs)


class _flat:
    """A flat contiguous view of `t`, or a contiguous copy written back on exit."""

    def __init__(self, t: torch.Tensor, *, copy_in: bool = True, copy_out: bool = True) -> None:
        self.t, self.copy_in, self.copy_out = t, copy_in, copy_out
        self.f: torch.Tensor | None = None

    def __enter__(self) -> torch.Tensor:
        require_dense(self.t)
        if self.t.is_contiguous():
            self.f = self.t.view(-1)
        elif self.copy_in:
            self.f = self.t.contiguous().view(-1)
        else:
            self.f = torch.empty(self.t.numel(), dtype=self.t.dtype, device=self.t.device)
        return self.f

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None and self.copy_out and self.f is not None and not self.t.is_contiguous():
            self.t.copy_(self.f.view_as(self.t))


def _check(ok: bool, what: str, a: torch.Tensor, b: torch.Tensor, n: int) -> None:
    if not ok:
        raise ValueError(f"{what}: {a.numel()} elements, expected {n} x {b.numel()}")


def _rows(t: torch.Tensor, splits: list[int], n: int, what: str) -> list[int]:
    """all_to_all splits in rows of dim 0 (equal when not given)."""
    rows = int(t.shape[0]) if t.dim() else 1
    if not splits:
        if rows % n:
            raise ValueError(f"all_to_all {what}: {rows} rows do not split into {n} equal blocks")
        return [rows // n] * n
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"all_to_all {what} splits {list(splits)}: expected {n} sizes summing to {rows}")
    return [int(s) for s in splits]


def _counterparts(topo: Any, rank: int, relay_world: Communicator) -> Communicator | None:
    """The native communicator of the ranks with this rank's island rank, one per island, in
    island order; None where islands differ in size. Collective over the relay world: every
    rank decides alike from the topology."""
    if len({i.size for i in topo.islands}) != 1 or len(topo.islands) < 2:
        return None
    island = topo.of(rank)
    return relay_world.split(color=island.rank_of(rank), key=island.index)


def create(opts: Any, backend_options: Any = None) -> IslandsBackend:
    """torch's extended-API creator: discover the islands, build the inner groups."""
    rank, size = int(opts.group_rank), int(opts.group_size)
    world_ranks = list(opts.global_ranks_in_group) or list(range(size))
    group_id = str(opts.group_id)
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=1800)
    topo = exchange(opts.store, "hetobs-islands/identity/", rank, size)
    endpoint = _endpoint(rank, size, group_timeout(opts.timeout))
    if not opts.global_ranks_in_group:  # the default group: this is the job's world
        native = _connect_through_store(endpoint, opts.store, "hetobs/card/", rank, size)
    else:
        native = _connect_through_store(endpoint, opts.store, "hetobs/card/", rank, size,
                                        comm_id=comm_id_for(f"relay:{group_id}"), world_ranks=world_ranks)
    relay_world = Communicator(native)
    island = topo.of(rank)
    inner = make_island_group(topo, rank, opts.store, timeout, group_id, world_ranks, relay_world)
    stage = relay_stage()
    relay = Relay(relay_world, staged_host=stage == "host", pipeline=relay_pipelined(), generic_cuda=stage == "device")
    h = hier.Hierarchy(topo, rank, inner, relay, counterparts=_counterparts(topo, rank, relay_world))
    ext = _core.ExternalComm(comm_id_for(f"islands:{group_id}"), world_ranks, rank, ISLANDS_BACKEND_CODE,
                             device_code(island.device), f"hetobs_islands:{group_id}", island=island.name,
                             device_name=island.device, library=island.backend)
    if rank == 0:
        log.info("hetobs_islands: %s", ", ".join(f"{i.name} ({i.backend} on {i.device}): ranks "
                                                 f"{[world_ranks[m] for m in i.members]}" for i in topo.islands))
    return IslandsBackend(rank, size, h, ext, relay_world)
