"""Turn numpy arrays and torch CPU tensors into (pointer, count, dtype) views.

torch is never imported here: a tensor is recognised by its type's module, so a
rank that never touches torch never pays for importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Buffer", "DTYPES", "as_buffer"]

# Wire codes shared with csrc/include/hetobs/common/dtype.h (keep in sync).
DTYPES: dict[str, int] = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "int64": 3,
    "float16": 4,
    "bfloat16": 5,
    "float32": 6,
    "float64": 7,
}
_ITEMSIZE = {0: 1, 1: 1, 2: 4, 3: 8, 4: 2, 5: 2, 6: 4, 7: 8}


@dataclass(frozen=True)
class Buffer:
    """A contiguous host buffer. `owner` keeps the memory alive while an op runs."""

    ptr: int
    count: int
    dtype: int
    owner: Any

    @property
    def nbytes(self) -> int:
        return self.count * _ITEMSIZE[self.dtype]

    @property
    def dtype_name(self) -> str:
        return next(k for k, v in DTYPES.items() if v == self.dtype)


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def as_buffer(x: Any, what: str, *, writable: bool = False) -> Buffer:
    """Validate `x` (named `what` in errors) and return its raw view.

    Raises ValueError for anything the transport cannot take: unknown dtypes,
    non-contiguous memory, device tensors, read-only arrays that must be written.
    """
    if _is_torch_tensor(x):
        return _torch_buffer(x, what)
    try:
        import numpy as np
    except ImportError as e:  # pragma: no cover - numpy is a dependency
        raise ValueError(f"{what}: numpy is required for non-torch buffers") from e
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what}: expected a numpy array or a torch CPU tensor, got {type(x).__name__}")
    name = x.dtype.name
    if name not in DTYPES:
        raise ValueError(f"{what}: unsupported dtype {name}; supported: {', '.join(DTYPES)}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: array is not contiguous (pass np.ascontiguousarray(x))")
    if writable and not x.flags.writeable:
        raise ValueError(f"{what}: array is read-only but this collective writes into it")
    return Buffer(int(x.ctypes.data), int(x.size), DTYPES[name], x)


def _torch_buffer(t: Any, what: str) -> Buffer:
    if t.device.type != "cpu":
        raise ValueError(
            f"{what}: tensor is on {t.device}; the native transport takes CPU tensors "
            "(use the hetobs torch backend, which stages device tensors through host memory)"
        )
    name = str(t.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"{what}: unsupported dtype {name}; supported: {', '.join(DTYPES)}")
    if not t.is_contiguous():
        raise ValueError(f"{what}: tensor is not contiguous (pass x.contiguous())")
    return Buffer(int(t.data_ptr()), int(t.numel()), DTYPES[name], t)
