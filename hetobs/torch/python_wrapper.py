"""The Python fallback of the vendor wrapper, for when hetobs._torch_ext is not built for
the running torch (or HETOBS_TORCH_NATIVE=0): a `dist.ProcessGroup` subclass around the
vendor group, recording each op in the same ExternalComm. It hands back the vendor's own Work:
- asynchronous CPU ops (async_op=True, and all DDP's): never waited on here, so what the
  caller overlaps with the op (DDP: a bucket's all_reduce with the rest of backward) stays
  overlapped; the record ends from the vendor future's done-callback, or where the vendor
  Work has no future (Gloo's send, recv and reduce_scatter) at the caller's wait;
- torch's synchronous calls (opts.asyncOp false): waited on here, as torch does next anyway,
  and the record ends then (no Python callback on the vendor's thread fighting for the GIL);
- device tensors: a poller thread asks Work.is_completed() and records completion (a
  wait would synchronise the stream on the hot path).
Per small op it costs a few us more than the C++ wrapper at one rank, up to ~25 with more
(docs/PERF.md, "The cost of watching").
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import codes
from ._common import DTYPE_CODES, NamedGroup, done, numel, reduction_code

__all__ = ["InstrumentedBackend"]

log = logging.getLogger("hetobs")

_OP_CODES = codes.OP_CODES  # every recorded kind: gather and scatter too, beyond the native transport's


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


def _end_from_future(ext: Any, token: int, fut: Any) -> None:
    """Done-callback of a vendor future (on the vendor's thread): ends the op's record."""
    try:
        fut.wait()  # already complete: returns, or raises the op's error
    except Exception as e:  # telemetry never raises into the vendor's thread
        ext.end(token, False, f"{type(e).__name__}: {e}"[:90])
    else:
        ext.end(token, True, "")


class _EndAtWait(dist.Work):
    """A vendor Work without a future (Gloo's send, recv and reduce_scatter): its record ends
    at the first wait, or as not waited on when the Work is released."""

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

    def _source_rank(self) -> int:  # dist.recv() without a source asks who sent
        return int(self._inner._source_rank())

    def __del__(self) -> None:
        try:
            self._end(False, "work released before it was waited on")
        except Exception as e:  # at interpreter exit the native side may be gone: never raise here
            log.debug("ending a released record failed: %s", e)


class InstrumentedBackend(NamedGroup, dist.ProcessGroup):
    """`inner`: a vendor c10d Backend (Gloo, NCCL), a torch ProcessGroup (wrap()) or a Python
    ProcessGroup of a plugin; every op is recorded in `ext` and handed to it unchanged."""

    def __init__(self, inner: Any, ext: Any, name: str) -> None:
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.ext = ext
        self._name = name
        self._no_future: set[str] = set()  # ops whose vendor Work has no future, learned once
        self._group: Any = None  # torch's ProcessGroup around a C++ `inner`, for the ops only it exposes

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self._name

    def shutdown(self) -> None:
        # As the C++ wrapper: torch's destroy_process_group() shuts every group down; a wrapped
        # group the caller still holds must not keep the vendor group (and its worker threads)
        # alive into interpreter exit, where they abort the process.
        inner, self.inner, self._group = self.inner, None, None
        if inner is not None:
            inner.shutdown()

    def _vendor_group(self) -> Any:
        """What runs the coalesced ops: `inner` itself when it is a ProcessGroup, else a torch
        ProcessGroup holding it (Python bindings of a c10d Backend lack the coalesced ops;
        torch's ProcessGroup dispatches them to the backend's C++)."""
        if isinstance(self.inner, dist.ProcessGroup):
            return self.inner
        if self._group is None:
            kinds = dist.ProcessGroup.BackendType
            kind = {"gloo": kinds.GLOO, "nccl": kinds.NCCL}.get(str(self.inner.name()).lower(), kinds.CUSTOM)
            group = dist.ProcessGroup(self.inner.rank(), self.inner.size())
            for device in ("cuda",) if kind == kinds.NCCL else ("cpu", "cuda"):
                group._register_backend(torch.device(device), kind, self.inner)
            group._set_default_backend(kind)
            self._group = group
        return self._group

    def _run(self, op: str, tensors: list[torch.Tensor], call: Callable[[], Any], opts: Any = None, *,
             redop: int = 0, root: int = -1, out_count: int | None = None) -> Any:
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
        if work is None:  # a plugin that ran the op to completion
            self.ext.end(token, True, "")
            return done(tensors)
        if first is not None and first.device.type != "cpu":
            global _poller
            if _poller is None:
                _poller = _Poller()
            _poller.add(self.ext, work, token)
            return work
        if opts is not None and not getattr(opts, "asyncOp", True):
            # torch.distributed's own synchronous call (async_op=False), which waits at once: the
            # wait is ours, and the record ends here. A done-callback instead would run on the
            # vendor's thread, which must take the GIL from the caller between every two ops
            # (+300 us per 8 B all_reduce at 2 ranks here, against +20 us this way).
            try:
                work.wait()
            except BaseException as e:
                self.ext.end(token, False, f"{type(e).__name__}: {e}"[:90])
                raise
            self.ext.end(token, True, "")
            return work
        # Asynchronous (async_op=True, and every op DDP's reducer issues from C++): never waited
        # on here, so what the caller overlaps with the op (DDP's bucket all_reduce and the rest
        # of backward; an isend/irecv ring, which would deadlock) stays overlapped. The record
        # ends from the vendor future's callback, or at the caller's wait.
        if op not in self._no_future:
            try:
                fut = work.get_future()
            except (RuntimeError, NotImplementedError):  # "Work::getFuture not implemented": learned once
                self._no_future.add(op)
            else:
                fut.add_done_callback(functools.partial(_end_from_future, self.ext, token))
                return work
        return _EndAtWait(self.ext, work, token)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_reduce", tensors, lambda: self.inner.allreduce(tensors, opts), opts,
                         redop=_redop(opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_reduce", tensors, lambda: self.inner.allreduce_coalesced(tensors, opts), opts,
                         redop=_redop(opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run("broadcast", tensors, lambda: self.inner.broadcast(tensors, opts), opts,
                         root=opts.rootRank)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run("reduce", tensors, lambda: self.inner.reduce(tensors, opts), opts,
                         redop=_redop(opts), root=opts.rootRank)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_gather", inputs, lambda: self.inner.allgather(outputs, inputs, opts), opts,
                         out_count=sum(numel(o) for o in outputs))

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_gather", inputs, lambda: self.inner.allgather_coalesced(outputs, inputs, opts), opts,
                         out_count=sum(numel(o) for o in outputs))

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Any:
        return self._run("all_gather", [inp], lambda: self.inner._allgather_base(out, inp, opts), opts,
                         out_count=int(out.numel()))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any) -> Any:
        return self._run("all_gather", inputs,
                         lambda: self._vendor_group().all_gather_single_coalesced(outputs, inputs, opts), opts,
                         out_count=numel(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # torch's older name

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        flat = [t for ins in inputs for t in ins]
        return self._run("reduce_scatter", flat, lambda: self.inner.reduce_scatter(outputs, inputs, opts), opts,
                         redop=_redop(opts), out_count=numel(outputs))

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> Any:
        return self._run("reduce_scatter", [inp], lambda: self.inner._reduce_scatter_base(out, inp, opts), opts,
                         redop=_redop(opts), out_count=int(out.numel()))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any) -> Any:
        return self._run("reduce_scatter", inputs,
                         lambda: self._vendor_group().reduce_scatter_single_coalesced(outputs, inputs, opts), opts,
                         redop=_redop(opts), out_count=numel(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # torch's older name

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                          in_splits: list[int], opts: Any) -> Any:
        return self._run("all_to_all", [inp], lambda: self.inner.alltoall_base(out, inp, out_splits, in_splits, opts),
                         opts, out_count=int(out.numel()))

    _alltoall_base = all_to_all_single
    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_to_all", inputs, lambda: self.inner.alltoall(outputs, inputs, opts), opts,
                         out_count=numel(outputs))

    def barrier(self, opts: Any = None) -> Any:
        call = (lambda: self.inner.barrier(opts)) if opts is not None else self.inner.barrier
        return self._run("barrier", [], call, opts)

    # Coalescing the old way (every op between start and end is the vendor's to batch).
    def _start_coalescing(self, device: torch.device) -> None:
        self._vendor_group()._start_coalescing(device)

    def _end_coalescing(self, device: torch.device) -> Any:
        return self._vendor_group()._end_coalescing(device)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self._run("send", tensors, lambda: self.inner.send(tensors, dst, tag), root=dst)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._run("recv", tensors, lambda: self.inner.recv(tensors, src, tag), root=src)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        return self._run("recv", tensors, lambda: self.inner.recv_anysource(tensors, tag))

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._run("gather", inputs, lambda: self.inner.gather(outputs, inputs, opts), opts,
                         root=opts.rootRank)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        return self._run("scatter", outputs, lambda: self.inner.scatter(outputs, inputs, opts), opts,
                         root=opts.rootRank)
