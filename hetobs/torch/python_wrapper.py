"""The Python fallback of the vendor wrapper, for when hetobs._torch_ext is not built for
the running torch (or HETOBS_TORCH_NATIVE=0): a `dist.ProcessGroup` subclass around the
vendor group, recording each op in the same ExternalComm.
- CPU collectives: the vendor work is waited on inline, then recorded as done (Gloo's
  Work.get_future() is not implemented for every op, so futures are not chained);
- CPU send/recv: recorded as done when the caller waits (waiting inline would deadlock
  an isend/irecv ring);
- CUDA tensors: the work is not waited on (that would synchronise the stream on the
  hot path); a poller thread asks Work.is_completed() and records completion.
It costs ~20-35 us more per call than the C++ wrapper (docs/PERF.md).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from ._common import DTYPE_CODES, OPS, NamedGroup, done, numel, reduction_code

__all__ = ["InstrumentedBackend"]

log = logging.getLogger("hetobs")

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
        try:
            self._end(False, "work released before it was waited on")
        except Exception as e:  # at interpreter exit the native side may be gone: never raise here
            log.debug("ending a released send/recv record failed: %s", e)


class InstrumentedBackend(NamedGroup, dist.ProcessGroup):
    def __init__(self, inner: Any, ext: Any, name: str) -> None:
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.ext = ext
        self._name = name

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self._name

    def shutdown(self) -> None:
        # As the C++ wrapper: torch's destroy_process_group() shuts every group down; a wrapped
        # group the caller still holds must not keep the vendor group (and its worker threads)
        # alive into interpreter exit, where they abort the process.
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.shutdown()

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

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._run("all_gather", inputs, lambda: self.inner.allgather_coalesced(outputs, inputs, opts),
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
