"""Instrument a vendor process group (Gloo, NCCL): the job keeps its data path and gets
hetobs's records, counters, watchdog and dumps.

Backend names `"hetobs_gloo"` / `"hetobs_nccl"` (no colon: torch reads "a:b" as
device:backend) create the vendor group and wrap it; `hetobs.torch.wrap(group)` wraps
a group made elsewhere. Every op is recorded in an ExternalComm (native) before it is
handed to the vendor group and finished when it completes.

The wrapper is hetobs._torch_ext (C++, csrc/torch_ext/): a c10d Backend that torch
dispatches to like to Gloo itself, ending each record from the vendor future's
callback, from wait(), or, for device ops, from a poller asking the op's CUDA event.
Where that module is missing or was built for another torch, `InstrumentedBackend`
below does the same in Python (~20 us more per call):
- CPU tensors: the vendor work is waited on inline, then recorded as done (Gloo's
  Work.get_future() is not implemented for every op, so futures are not chained);
- CUDA tensors: the work is not waited on (that would synchronise the stream on the
  hot path); a poller thread asks Work.is_completed() and records completion.
While an op waits, the native watchdog sees it in flight, so a hang inside Gloo or
NCCL is dumped and diagnosed like a native one.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _connect_through_store, _core, _endpoint
from ..config import from_env
from ..comm import Communicator
from ._common import DTYPE_CODES, OPS, comm_id_for, done, numel, reduction_code

__all__ = ["InstrumentedBackend", "create_gloo", "create_nccl", "wrap", "native_wrapper"]

log = logging.getLogger("hetobs")

_BACKEND_CODES = {"gloo": 1, "nccl": 2, "mpi": 3}
_OP_CODES = {**OPS, "gather": 9, "scatter": 10}  # recorded kinds beyond the native transport's


def _redop(opts: Any) -> int:
    return reduction_code(opts.reduceOp)


class _Poller:
    """Finishes records of device ops when their vendor Work completes (one daemon thread)."""

    def __init__(self) -> None:
        self._pending: list[tuple[Any, Any, int]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="hetobs-work-poller", daemon=True).start()

    def add(self, ext: Any, work: Any, token: int) -> None:
        with self._lock:
            self._pending.append((ext, work, token))
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                pending, self._pending = self._pending, []
            still = []
            for ext, work, token in pending:
                try:
                    if not work.is_completed():
                        still.append((ext, work, token))
                        continue
                    ext.end(token, bool(work.is_success()) if hasattr(work, "is_success") else True, "")
                except Exception as e:  # telemetry never raises into the job
                    ext.end(token, False, str(e)[:90])
            with self._lock:
                self._pending = still + self._pending
                if not self._pending:
                    self._wake.clear()
            if still:
                time.sleep(0.0005)  # nothing to block on: CUDA events are polled


_poller: _Poller | None = None


class _P2PWork(dist.Work):
    """A vendor send/recv Work whose record ends at the first wait (or at release)."""

    def __init__(self, ext: Any, inner: Any, token: int) -> None:
        super().__init__()
        self._ext, self._inner, self._token = ext, inner, token
        self._ended = False

    def _end(self, ok: bool, error: str = "") -> None:
        if not self._ended:
            self._ended = True
            self._ext.end(self._token, ok, error)

    def wait(self, timeout: Any = None) -> bool:
        if self._ended:
            return True  # waiting twice on a finished Gloo send/recv work blocks forever
        try:
            self._inner.wait() if timeout is None else self._inner.wait(timeout)
        except BaseException as e:
            self._end(False, f"{type(e).__name__}: {e}"[:90])
            raise
        self._end(True)
        return True

    def is_completed(self) -> bool:
        return self._ended or bool(self._inner.is_completed())

    def __del__(self) -> None:
        self._end(False, "work released before it was waited on")


class InstrumentedBackend(dist.ProcessGroup):
    def __init__(self, inner: Any, ext: Any, name: str) -> None:
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.ext = ext
        self._name = name

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self._name

    def _run(self, op: str, tensors: list[torch.Tensor], call: Callable[[], Any], *, redop: int = 0,
             root: int = -1, out_count: int | None = None) -> Any:
        # Per-call cost matters (a few us against Gloo's tens): one tensor is the common case.
        if len(tensors) == 1:
            first = tensors[0]
            count = first.numel()
            nbytes = count * first.element_size()
        else:
            first = tensors[0] if tensors else None
            count = numel(tensors)
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
        token = self.ext.begin(_OP_CODES[op], DTYPE_CODES.get(first.dtype, 6) if first is not None else 6, redop, root,
                               count, count if out_count is None else out_count, nbytes)
        try:
            work = call()
        except BaseException as e:
            self.ext.end(token, False, f"{type(e).__name__}: {e}"[:90])
            raise
        if first is not None and first.device.type != "cpu":
            global _poller
            if _poller is None:
                _poller = _Poller()
            _poller.add(self.ext, work, token)
            return work
        if op in ("send", "recv"):
            # Not waited on here: an isend/irecv ring would deadlock (every rank stuck in
            # its send). The record ends when the caller waits.
            return _P2PWork(self.ext, work, token)
        try:
            work.wait()
        except BaseException as e:
            self.ext.end(token, False, f"{type(e).__name__}: {e}"[:90])
            raise
        self.ext.end(token, True, "")
        # A fresh completed Work, not the vendor's: waiting twice on a finished Gloo send/recv
        # work hangs, and its future is not implemented for every op.
        return done(tensors)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_reduce", tensors, lambda: self.inner.allreduce(tensors, opts), redop=_redop(opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_reduce", tensors, lambda: self.inner.allreduce_coalesced(tensors, opts),
                         redop=_redop(opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run("broadcast", tensors, lambda: self.inner.broadcast(tensors, opts), root=opts.rootRank)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run("reduce", tensors, lambda: self.inner.reduce(tensors, opts), redop=_redop(opts),
                         root=opts.rootRank)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_gather", inputs, lambda: self.inner.allgather(outputs, inputs, opts),
                         out_count=sum(numel(o) for o in outputs))

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Any:
        return self._run("all_gather", [inp], lambda: self.inner._allgather_base(out, inp, opts),
                         out_count=int(out.numel()))

    _allgather_base = all_gather_single

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        flat = [t for ins in inputs for t in ins]
        return self._run("reduce_scatter", flat, lambda: self.inner.reduce_scatter(outputs, inputs, opts),
                         redop=_redop(opts), out_count=numel(outputs))

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Any:
        return self._run("reduce_scatter", [inp], lambda: self.inner._reduce_scatter_base(out, inp, opts),
                         redop=_redop(opts), out_count=int(out.numel()))

    _reduce_scatter_base = reduce_scatter_single

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                          in_splits: list[int], opts: Any) -> Any:
        return self._run("all_to_all", [inp], lambda: self.inner.alltoall_base(out, inp, out_splits, in_splits,
                                                                                 opts), out_count=int(out.numel()))

    _alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_to_all", inputs, lambda: self.inner.alltoall(outputs, inputs, opts),
                         out_count=numel(outputs))

    def barrier(self, opts: Any = None) -> Any:
        call = (lambda: self.inner.barrier(opts)) if opts is not None else self.inner.barrier
        return self._run("barrier", [], call)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self._run("send", tensors, lambda: self.inner.send(tensors, dst, tag), root=dst)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._run("recv", tensors, lambda: self.inner.recv(tensors, src, tag), root=src)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._run("gather", inputs, lambda: self.inner.gather(outputs, inputs, opts), root=opts.rootRank)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        return self._run("scatter", outputs, lambda: self.inner.scatter(outputs, inputs, opts),
                         root=opts.rootRank)


_NOT_LOADED: Any = object()
_native: Any = _NOT_LOADED


def native_wrapper() -> Any:
    """hetobs._torch_ext when it was built for the running torch, else None."""
    global _native
    if _native is _NOT_LOADED:
        _native = None
        if not from_env().torch_native:
            return None
        try:
            from .. import _torch_ext
        except ImportError as e:  # not built (no torch at build time) or built for another torch
            log.info("hetobs._torch_ext not loadable (%s): torch wrappers run in Python", e)
            return None
        if _torch_ext.TORCH_VERSION != torch.__version__:
            log.warning("hetobs._torch_ext was built for torch %s, this is %s: torch wrappers run in Python "
                        "(~20 us more per call); reinstall hetobs to rebuild it", _torch_ext.TORCH_VERSION,
                        torch.__version__)
        else:
            _native = _torch_ext
    return _native


def _instrument(inner: Any, ext: Any, vendor: str) -> Any:
    """The vendor backend `inner`, recorded in `ext`: a C++ c10d Backend where possible."""
    native = native_wrapper()
    if native is not None:
        return native.instrument(inner, ext._hooks(), f"hetobs_{vendor}", vendor == "nccl")
    return InstrumentedBackend(inner, ext, f"hetobs_{vendor}")


def _external(comm_id: int, world_ranks: list[int], rank: int, vendor: str, device: int, name: str) -> Any:
    return _core.ExternalComm(comm_id, world_ranks, rank, _BACKEND_CODES[vendor], device, name)


def _create(vendor: str, opts: Any, backend_options: Any) -> Any:
    rank, size = int(opts.group_rank), int(opts.group_size)
    world_ranks = list(opts.global_ranks_in_group) or list(range(size))
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=1800)
    vendor_store = dist.PrefixStore(f"{vendor}/", opts.store)
    if vendor == "gloo":
        inner = dist.ProcessGroupGloo(vendor_store, rank, size, timeout)
        device = 0
    else:
        inner = dist.ProcessGroupNCCL(vendor_store, rank, size, backend_options or
                                      dist.ProcessGroupNCCL.Options())
        device = 1
    if not opts.global_ranks_in_group:
        # The default group: join the job (listener, side channel, world) through the store.
        endpoint = _endpoint(rank, size)
        _InstrumentedWorld.comm = Communicator(_connect_through_store(endpoint, opts.store, "hetobs/card/", rank,
                                                                      size))
        comm_id = 1 << 52  # the vendor world: distinct from the native world (0)
    else:
        comm_id = comm_id_for(str(opts.group_id))
    ext = _external(comm_id, world_ranks, rank, vendor, device, f"{vendor}:{opts.group_id}")
    return _instrument(inner, ext, vendor)


class _InstrumentedWorld:
    comm: Communicator | None = None  # keeps the job's side channel alive


def create_gloo(opts: Any, backend_options: Any = None) -> Any:
    return _create("gloo", opts, backend_options)


def create_nccl(opts: Any, backend_options: Any = None) -> Any:
    return _create("nccl", opts, backend_options)


def wrap(group: Any, vendor: str | None = None) -> Any:
    """Instrument an existing process group; use the returned group in dist calls instead.

    Collective over the group's members (nothing is sent: each member derives the same
    communicator id from the group's name). The wrapper is registered with torch under
    the same ranks, so every `torch.distributed` call accepts it.
    """
    from torch.distributed import distributed_c10d as c10d

    ranks = dist.get_process_group_ranks(group)
    name = c10d._get_process_group_name(group)
    vendor = vendor or str(dist.get_backend(group)).lower()
    if vendor not in _BACKEND_CODES:
        raise ValueError(f"cannot wrap a {vendor!r} group (gloo, nccl or mpi)")
    device = 1 if vendor == "nccl" else 0
    ext = _external(comm_id_for(f"wrap:{name}"), ranks, group.rank(), vendor, device, f"{vendor}:{name}")
    native = native_wrapper()
    if native is None:
        wrapped = InstrumentedBackend(group, ext, f"hetobs_{vendor}")
    else:
        # A ProcessGroup of torch's own whose backends are the group's, instrumented.
        wrapped = dist.ProcessGroup(group.rank(), group.size())
        custom = dist.ProcessGroup.BackendType.CUSTOM
        hooks = ext._hooks()
        for dev in ("cpu", "cuda"):
            try:
                inner = group._get_backend(torch.device(dev))
            except RuntimeError:  # the group has no backend for this device
                continue
            wrapped._register_backend(torch.device(dev), custom,
                                      native.instrument(inner, hooks, f"hetobs_{vendor}", vendor == "nccl"))
        wrapped._set_default_backend(custom)
        wrapped._set_group_name(name)
    w = c10d._world
    w.pg_group_ranks[wrapped] = w.pg_group_ranks[group]
    w.pg_map[wrapped] = w.pg_map[group]
    w.pg_names[wrapped] = w.pg_names[group]
    if group in w.pg_backend_config:
        w.pg_backend_config[wrapped] = w.pg_backend_config[group]
    return wrapped
