"""Shared by the torch backends: op codes, reduction mapping, staging, completed works."""

from __future__ import annotations

import zlib
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]  # private, in every torch we build for

from .. import codes
from ..buffers import DTYPES
from ..comm import OPS, REDUCTIONS

__all__ = ["reduction", "reduction_code", "done", "staged", "comm_id_for", "DTYPE_CODES", "OPS", "REDUCTIONS",
           "NamedGroup", "require_dense"]

# torch dtype -> wire dtype code (hetobs/buffers.py DTYPES).
DTYPE_CODES = {getattr(torch, name): code for name, code in DTYPES.items()}
# SUM first: the common case, and each comparison of ReduceOps is a C++ call.
_REDUCTIONS = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max", dist.ReduceOp.AVG: "avg",
}
_OTHER = codes.REDUCTION_CODES["other"]  # a vendor reduction hetobs cannot name


def _name(op: Any) -> str | None:
    for k, v in _REDUCTIONS.items():
        if op == k:
            return v
    return None


def reduction(op: Any) -> str:
    """torch ReduceOp -> hetobs reduction name (ValueError for PREMUL_SUM, BAND, ...)."""
    name = _name(op)
    if name is None:
        raise ValueError(f"reduce op {op} is not supported by hetobs (sum, product, min, max, avg are)")
    return name


def reduction_code(op: Any) -> int:
    """torch ReduceOp -> wire reduction code for a record of a vendor op ("other" if unnamed)."""
    name = _name(op)
    return _OTHER if name is None else REDUCTIONS[name]


def done(result: Any = None) -> Any:
    """A torch Work that is already complete (ops run to completion before returning)."""
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def require_dense(t: torch.Tensor) -> None:
    """Refuse a sparse (or other non-strided) tensor in one line, before is_contiguous(), which such
    a tensor cannot answer ("unsupported memory format option Contiguous")."""
    if t.layout != torch.strided:
        raise ValueError(f"hetobs moves dense tensors only, not {t.layout} (torch.sparse_coo: "
                         "all_reduce its .to_dense(), or all_gather its indices and values)")


class staged:
    """Context manager yielding a CPU tensor for `t`; device tensors are copied in and back out.

    The native transport moves host memory: a device tensor goes through a host copy
    (a pipelined host relay is on the roadmap; this is the simple, correct version).
    """

    def __init__(self, t: torch.Tensor, *, copy_in: bool = True, copy_out: bool = True) -> None:
        self.t, self.copy_in, self.copy_out = t, copy_in, copy_out
        self.host: torch.Tensor | None = None

    def __enter__(self) -> torch.Tensor:
        require_dense(self.t)
        if self.t.device.type == "cpu" and self.t.is_contiguous():
            self.host = self.t
        elif self.copy_in:
            self.host = self.t.detach().to("cpu", copy=True).contiguous()
        else:
            self.host = torch.empty(self.t.shape, dtype=self.t.dtype, device="cpu")
        return self.host

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None and self.copy_out and self.host is not None and self.host is not self.t:
            self.t.copy_(self.host)


def comm_id_for(group_id: str) -> int:
    """A communicator id every member derives alike from torch's group name (53 bits, nonzero)."""
    return (zlib.crc32(group_id.encode()) << 21 | zlib.adler32(group_id.encode()) & 0x1FFFFF) or 1


def numel(ts: Iterable[torch.Tensor]) -> int:
    return sum(int(t.numel()) for t in ts)


class NamedGroup:
    """The name and description of a process group written in Python, kept by the group itself.

    torch keeps them in a group's backends (ProcessGroup::getGroupName reads the first one
    registered), and a ProcessGroup subclass made in Python registers none: its
    `group_name` raised "ProcessGroup name not set", and `destroy_process_group(group)` of
    any group but the world failed with it. Put before dist.ProcessGroup in the bases.
    """

    _hetobs_group_name = ""
    _hetobs_group_desc = ""

    def _set_group_name(self, name: str) -> None:
        self._hetobs_group_name = name

    @property
    def group_name(self) -> str:
        return self._hetobs_group_name

    def _set_group_desc(self, desc: str) -> None:
        self._hetobs_group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._hetobs_group_desc
