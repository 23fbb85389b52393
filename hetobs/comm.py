"""Communicator: collectives on numpy arrays and torch CPU tensors over the native transport.

Every check that can be made before bytes move is made here, so a wrong shape or
dtype is a ValueError naming the argument, never a mismatch seen by peers.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Literal, Sequence, overload

from . import _core, codes
from ._relay_targets import cuda_buffer, cuda_stream_handle, current_cuda_device, device_buffers, device_target
from .buffers import Buffer, as_buffer
from .config import check_timeout

__all__ = ["Communicator", "Work", "OPS", "REDUCTIONS", "RELAY_STAGES"]

# The native transport's op codes (codes.OP_CODES, from _core): gather and scatter are
# recorded for vendor libraries only (csrc/include/hetobs/common/wire.h).
_VENDOR_ONLY_OPS = ("gather", "scatter")
OPS: dict[str, int] = {name: code for name, code in codes.OP_CODES.items() if name not in _VENDOR_ONLY_OPS}
RELAY_STAGES: dict[str, int] = {"none": 0, "host": 1, "cuda": 2, "device": 3}  # csrc/include/hetobs/relay/relay.h
# The reductions hetobs runs (RedOp::kOther only names a vendor's in a record).
REDUCTIONS: dict[str, int] = {name: code for name, code in codes.REDUCTION_CODES.items() if name != "other"}
_SUM = "sum"
_FRONTED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
_FLOATS = {"float16", "bfloat16", "float32", "float64"}


class Work:
    """Handle of an async op: `wait()` blocks (GIL released) and re-raises the op's error."""

    def __init__(self, native: Any, keep_alive: tuple[Any, ...]) -> None:
        self._native = native
        self._keep_alive: tuple[Any, ...] | None = keep_alive

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for completion; returns False if `timeout` seconds passed first (None or inf: no limit)."""
        done = bool(self._native.wait(check_timeout(timeout)))
        if done:
            self._keep_alive = None
        return done

    def is_completed(self) -> bool:
        return bool(self._native.is_completed())

    def result(self) -> dict[str, int] | None:
        """Wait, then what the op measured: a relay's phases dict; None for other ops."""
        self.wait()
        phases = getattr(self._native, "phases", None)
        return dict(phases()) if phases is not None else None


@functools.cache
def _relay_defaults() -> tuple[int, int]:
    """HETOBS_RELAY_CHUNK_BYTES and HETOBS_RELAY_SLOTS, read once."""
    from .config import from_env

    s = from_env()
    return s.relay_chunk_bytes, s.relay_slots


def _block(count: int, size: int, index: int) -> tuple[int, int]:
    """(offset, length) of block `index` when `count` elements are split over `size` ranks
    as numpy.array_split does: the first count % size blocks get one more element."""
    base, extra = divmod(count, size)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


class Communicator:
    """A group of ranks. Made by `hetobs.init()`, `split()` or `new_group()`."""

    def __init__(self, native: Any) -> None:
        self._native = native
        # Bound once, as plain C functions: a small op pays ~1 us in Python, and an attribute
        # lookup, a bound-method object and pybind11's dispatch per call are part of it. Each
        # checks numpy arrays itself and declines (returns False) what the general path explains.
        self._fast_all_reduce = native.fast_entry("all_reduce")
        self._fast_all_gather = native.fast_entry("all_gather")
        self._fast_reduce_scatter = native.fast_entry("reduce_scatter")
        self._fast_broadcast = native.fast_entry("broadcast")
        # The public blocking methods' commonest calls (all_reduce(x), broadcast(x, root), ...)
        # without a Python frame either: C functions in the instance that run those and hand any
        # other call to the methods below, so a caller's call reaches C at once, as mpi4py's does.
        # Not on a subclass, whose override they would skip.
        if type(self) is Communicator:
            for name in _FRONTED:
                setattr(self, name, native.fast_front(name, getattr(Communicator, name), self))

    # -- identity -----------------------------------------------------------------
    @property
    def rank(self) -> int:
        return int(self._native.rank)

    @property
    def size(self) -> int:
        return int(self._native.size)

    @property
    def id(self) -> int:
        """Communicator id, the same on every member (the world is 0)."""
        return int(self._native.comm_id)

    @property
    def global_ranks(self) -> list[int]:
        """World rank of each member, in this communicator's rank order."""
        return list(self._native.global_ranks)

    @property
    def address(self) -> tuple[str, int]:
        """(ip, port) of this rank's authenticated listener (what peers connect to)."""
        host, port = self._native.address
        return str(host), int(port)

    def __repr__(self) -> str:
        return f"<hetobs.Communicator id={self.id} rank={self.rank}/{self.size}>"

    # -- plumbing -----------------------------------------------------------------
    def _reduction(self, op: str, buf: Buffer) -> int:
        if op not in REDUCTIONS:
            raise ValueError(f"op={op!r}: expected one of {', '.join(REDUCTIONS)}")
        if op == "avg" and buf.dtype_name not in _FLOATS:
            raise ValueError(f"op='avg' needs a floating dtype, got {buf.dtype_name}")
        return REDUCTIONS[op]

    def _run(self, name: str, send: Buffer | None, recv: Buffer | None, *, redop: int = 0,
             root: int = 0, async_op: bool = False, timeout: float | None = None) -> Work | None:
        s = send or recv
        r = recv or send
        native = self._native.run(
            OPS[name],
            s.ptr if s else 0, s.count if s else 0,
            r.ptr if r else 0, r.count if r else 0,
            (s or r).dtype if (s or r) else 6,  # type: ignore[union-attr]  # one of them is there
            redop, root, check_timeout(timeout), async_op,
        )
        if async_op:
            return Work(native, (send.owner if send else None, recv.owner if recv else None))
        return None

    def _check_rank(self, value: int, what: str) -> int:
        try:
            rank = operator.index(value)  # ints and numpy integers, not floats or bools' strings
        except TypeError:
            raise ValueError(f"{what}={value!r}: expected a rank in [0, {self.size})") from None
        if isinstance(value, bool) or not 0 <= rank < self.size:
            raise ValueError(f"{what}={value!r}: expected a rank in [0, {self.size})")
        return rank

    @staticmethod
    def _same_dtype(a: Buffer, b: Buffer, names: str) -> None:
        if a.dtype != b.dtype:
            raise ValueError(f"{names}: dtypes differ ({a.dtype_name} vs {b.dtype_name})")

    # -- collectives ----------------------------------------------------------------
    def all_reduce(self, x: Any, op: str = "sum", *, async_op: bool = False,
                   timeout: float | None = None) -> Work | None:
        """Reduce `x` across ranks, in place."""
        if not async_op and timeout is None:
            # The reduction's code, or None for what only the general path explains. `op is _SUM`:
            # the default "sum" is the same interned string, no lookup needed.
            red = 0 if op is _SUM else REDUCTIONS.get(op) if isinstance(op, str) else None
            if red is not None and self._fast_all_reduce(x, red):
                return None
        b = as_buffer(x, "all_reduce x", writable=True)
        return self._run("all_reduce", b, b, redop=self._reduction(op, b), async_op=async_op, timeout=timeout)

    def reduce_scatter(self, out: Any, x: Any, op: str = "sum", *, async_op: bool = False,
                       timeout: float | None = None) -> Work | None:
        """Reduce `x` across ranks; `out` gets this rank's block (blocks split as numpy.array_split)."""
        if not async_op and timeout is None:
            red = 0 if op is _SUM else REDUCTIONS.get(op) if isinstance(op, str) else None  # as all_reduce's
            if red is not None and self._fast_reduce_scatter(out, x, red):
                return None
        o, b = as_buffer(out, "reduce_scatter out", writable=True), as_buffer(x, "reduce_scatter x")
        self._same_dtype(o, b, "reduce_scatter out/x")
        want = _block(b.count, self.size, self.rank)[1]
        if o.count != want:
            raise ValueError(f"reduce_scatter out: has {o.count} elements, rank {self.rank}'s block of "
                             f"{b.count} over {self.size} ranks has {want}")
        return self._run("reduce_scatter", b, o, redop=self._reduction(op, b), async_op=async_op, timeout=timeout)

    def all_gather(self, out: Any, x: Any, *, async_op: bool = False,
                   timeout: float | None = None) -> Work | None:
        """Concatenate every rank's `x` into `out` (size * x.size elements), in rank order."""
        if not async_op and timeout is None and self._fast_all_gather(out, x):
            return None
        o, b = as_buffer(out, "all_gather out", writable=True), as_buffer(x, "all_gather x")
        self._same_dtype(o, b, "all_gather out/x")
        if o.count != b.count * self.size:
            raise ValueError(f"all_gather out: has {o.count} elements, expected {self.size} x {b.count}")
        return self._run("all_gather", b, o, async_op=async_op, timeout=timeout)

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False,
                  timeout: float | None = None) -> Work | None:
        """Copy root's `x` into every rank's `x`."""
        if not async_op and timeout is None and self._fast_broadcast(x, root):
            return None
        b = as_buffer(x, "broadcast x", writable=True)
        return self._run("broadcast", b, b, root=self._check_rank(root, "root"), async_op=async_op, timeout=timeout)

    def reduce(self, x: Any, root: int = 0, op: str = "sum", *, async_op: bool = False,
               timeout: float | None = None) -> Work | None:
        """Reduce `x` onto root's `x`; other ranks' `x` is left unchanged."""
        b = as_buffer(x, "reduce x", writable=True)
        return self._run("reduce", b, b, redop=self._reduction(op, b), root=self._check_rank(root, "root"),
                         async_op=async_op, timeout=timeout)

    def all_to_all(self, out: Any, x: Any, *, async_op: bool = False,
                   timeout: float | None = None) -> Work | None:
        """Block j of `x` goes to rank j; block i of `out` comes from rank i (equal blocks)."""
        o, b = as_buffer(out, "all_to_all out", writable=True), as_buffer(x, "all_to_all x")
        self._same_dtype(o, b, "all_to_all out/x")
        if b.count % self.size:
            raise ValueError(f"all_to_all x: {b.count} elements do not split into {self.size} equal blocks")
        if o.count != b.count:
            raise ValueError(f"all_to_all out: has {o.count} elements, expected {b.count} (same as x)")
        return self._run("all_to_all", b, o, async_op=async_op, timeout=timeout)

    def barrier(self, *, async_op: bool = False, timeout: float | None = None) -> Work | None:
        return self._run("barrier", None, None, async_op=async_op, timeout=timeout)

    def send(self, x: Any, peer: int, *, async_op: bool = False, timeout: float | None = None) -> Work | None:
        b = as_buffer(x, "send x")
        peer = self._check_rank(peer, "peer")
        if peer == self.rank:
            raise ValueError(f"peer={peer}: a rank cannot send to itself")
        return self._run("send", b, None, root=peer, async_op=async_op, timeout=timeout)

    def recv(self, x: Any, peer: int, *, async_op: bool = False, timeout: float | None = None) -> Work | None:
        b = as_buffer(x, "recv x", writable=True)
        peer = self._check_rank(peer, "peer")
        if peer == self.rank:
            raise ValueError(f"peer={peer}: a rank cannot receive from itself")
        return self._run("recv", None, b, root=peer, async_op=async_op, timeout=timeout)

    @overload
    def relay(self, sends: Sequence[tuple[int, Any]], recvs: Sequence[tuple[int, Any]], *, stage: str = "none",
              pipeline: bool = True, chunk_bytes: int | None = None, slots: int | None = None,
              timeout: float | None = None, async_op: Literal[False] = False,
              cuda_stream: Any = None, stream: Any = None) -> dict[str, int]: ...

    @overload
    def relay(self, sends: Sequence[tuple[int, Any]], recvs: Sequence[tuple[int, Any]], *, stage: str = "none",
              pipeline: bool = True, chunk_bytes: int | None = None, slots: int | None = None,
              timeout: float | None = None, async_op: Literal[True],
              cuda_stream: Any = None, stream: Any = None) -> "Work": ...

    @overload
    def relay(self, sends: Sequence[tuple[int, Any]], recvs: Sequence[tuple[int, Any]], *, stage: str = "none",
              pipeline: bool = True, chunk_bytes: int | None = None, slots: int | None = None,
              timeout: float | None = None, async_op: bool = False,
              cuda_stream: Any = None, stream: Any = None) -> "dict[str, int] | Work": ...

    def relay(self, sends: Sequence[tuple[int, Any]], recvs: Sequence[tuple[int, Any]], *, stage: str = "none",
              pipeline: bool = True, chunk_bytes: int | None = None, slots: int | None = None,
              timeout: float | None = None, async_op: bool = False,
              cuda_stream: Any = None, stream: Any = None) -> "dict[str, int] | Work":
        """Move bytes: each (peer, buf) of `sends` lands in the matching (this rank, buf) of the
        peer's `recvs`, all at once, as one op (p2p-style: only the ranks that call it take part).

        Buffers are host arrays/tensors for stage "none" (on the wire directly) and "host" (copied
        through host staging slots by copy threads); for stage "cuda" a device buffer given as
        (data_ptr, nbytes) or a CUDA tensor. pipeline=True cuts messages into `chunk_bytes` chunks
        (default HETOBS_RELAY_CHUNK_BYTES) through `slots` staging slots each way (default
        HETOBS_RELAY_SLOTS) so copy-in, wire and copy-out overlap; False copies all, sends all,
        copies all. stage "cuda": the relay's copies run on streams of its own, ordered after the work
        queued so far on `cuda_stream` (a torch.cuda.Stream, or a raw cudaStream_t as int; default
        torch's current stream when torch is imported), with no host synchronisation; the data has
        landed in device memory when the relay returns. stage "device": torch tensors of any one
        non-CPU device (npu, xpu, a PrivateUse1 device, cuda), copied through torch's
        device-generic API on streams of the relay's own, ordered after `stream` (a torch.Stream
        of that device; default its current stream), the caller's current device left as it was.
        Returns the phases {"d2h_ns", "wire_ns", "h2d_ns", "wall_ns", "chunks",
        "bytes_sent", "bytes_recv"}, or with async_op a Work whose result() returns them."""
        if stage not in RELAY_STAGES:
            raise ValueError(f"stage={stage!r}: expected one of {', '.join(RELAY_STAGES)}")
        chunk, nslots = _relay_defaults()
        chunk = self._positive(chunk_bytes, "chunk_bytes") if chunk_bytes is not None else chunk
        nslots = self._positive(slots, "slots") if slots is not None else nslots
        keep: list[Any] = []
        devices: list[Any] = []
        s_list = self._relay_list(sends, "sends", stage, keep, devices, writable=False)
        r_list = self._relay_list(recvs, "recvs", stage, keep, devices, writable=True)
        device, cuda, target = -1, 0, None
        if stage == "cuda":
            device, cuda = current_cuda_device(), cuda_stream_handle(cuda_stream)
        elif stage == "device" and devices:
            target = device_target(devices[0], stream)
            device = target.index
        elif stage == "device":  # nothing to move: no device to stage through
            stage = "none"
        native = self._native.relay(s_list, r_list, RELAY_STAGES[stage], bool(pipeline), chunk, nslots,
                                    -1.0 if timeout is None else float(timeout), async_op, device, cuda,
                                    target.device_type if target else -1, target.stream_id if target else None)
        if async_op:
            return Work(native, tuple(keep))
        return dict(native)

    @staticmethod
    def _positive(value: Any, what: str) -> int:
        try:
            n = operator.index(value)
        except TypeError:
            raise ValueError(f"{what}={value!r}: expected a positive integer") from None
        if isinstance(value, bool) or n < 1:
            raise ValueError(f"{what}={value!r}: expected a positive integer")
        return n

    def _relay_list(self, items: Sequence[tuple[int, Any]], what: str, stage: str, keep: list[Any],
                    devices: list[Any], *, writable: bool) -> list[tuple[int, int, int]]:
        peers = []
        for i, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(f"relay {what}[{i}]: expected a (peer, buffer) pair, got {type(item).__name__}")
            peer = self._check_rank(item[0], f"relay {what}[{i}] peer")
            if peer == self.rank:
                raise ValueError(f"relay {what}[{i}] peer={peer}: a rank cannot relay to itself")
            peers.append(peer)
            keep.append(item[1])
        if stage == "device":  # every tensor on one device, checked together
            addrs = device_buffers(items, what, devices)
        elif stage == "cuda":
            addrs = [cuda_buffer(item[1], f"relay {what}[{i}]") for i, item in enumerate(items)]
        else:
            addrs = [(b.ptr, b.nbytes) for b in (as_buffer(item[1], f"relay {what}[{i}]", writable=writable)
                                                 for i, item in enumerate(items))]
        return [(peer, ptr, nbytes) for peer, (ptr, nbytes) in zip(peers, addrs, strict=True)]

    # -- groups ---------------------------------------------------------------------
    def split(self, color: int, key: int | None = None) -> "Communicator | None":
        """Collective over this communicator: ranks with equal `color` form a new one, ordered
        by (key, rank). A negative color takes part but joins none (returns None)."""
        native = self._native.split(int(color), self.rank if key is None else int(key))
        return None if native is None else Communicator(native)

    def new_group(self, ranks: Sequence[int]) -> "Communicator | None":
        """Collective over this communicator: a new one of `ranks` (in that order); None elsewhere."""
        members = [self._check_rank(r, "ranks[]") for r in ranks]
        if len(set(members)) != len(members) or not members:
            raise ValueError(f"ranks={list(ranks)!r}: expected distinct ranks, at least one")
        color = 0 if self.rank in members else -1
        key = members.index(self.rank) if self.rank in members else 0
        return self.split(color, key)

    # -- introspection ---------------------------------------------------------------
    def records(self) -> list[dict[str, Any]]:
        """Recent op records of this communicator (oldest first) as plain dicts."""
        return [r for r in _core.records() if r["comm_id"] == self.id]

    def links(self) -> list[dict[str, Any]]:
        """Per-peer link counters: bytes each way, busy time, last activity, transport."""
        return list(self._native.links())

    def close(self) -> None:
        """Finish queued ops, close connections. Idempotent."""
        self._native.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
