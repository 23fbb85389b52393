"""Turn numpy arrays and torch CPU tensors into (pointer, count, dtype) views.

torch is never imported here: a tensor is recognised by its type's module, so a
rank that never touches torch never pays for importing it.
"""

from __future__ import annotations

from typing import Any

from . import _core, codes

__all__ = ["Buffer", "DTYPES", "as_buffer"]

# Wire dtype codes and item sizes, from _core (csrc/include/hetobs/common/wire.h).
DTYPES: dict[str, int] = dict(codes.DTYPE_CODES)
_ITEMSIZE = dict(enumerate(codes.DTYPE_SIZES))


class Buffer:
    """A contiguous host buffer. `owner` keeps the memory alive while an op runs.

    A plain slotted class, not a dataclass: it is built on every collective call, and
    a frozen dataclass costs ~0.5 us to construct.
    """

    __slots__ = ("ptr", "count", "dtype", "owner")

    def __init__(self, ptr: int, count: int, dtype: int, owner: Any) -> None:
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.owner = owner

    @property
    def nbytes(self) -> int:
        return self.count * _ITEMSIZE[self.dtype]

    @property
    def dtype_name(self) -> str:
        return next(k for k, v in DTYPES.items() if v == self.dtype)


def _is_torch_tensor(x: Any) -> bool:
    return hasattr(x, "data_ptr") and type(x).__module__.startswith("torch")


def _numpy_codes() -> dict[str, int]:
    # dtype.char -> wire code. dtype.name builds a new string on every access (~2 us), so the
    # hot path looks up the one-character code instead.
    import numpy as np

    return {np.dtype(name).char: code for name, code in DTYPES.items() if name != "bfloat16"}


_CHAR_CODES: dict[str, int] | None = None


def as_buffer(x: Any, what: str, *, writable: bool = False) -> Buffer:
    """Validate `x` (named `what` in errors) and return its raw view.

    Raises ValueError for anything the transport cannot take: unknown dtypes,
    non-contiguous memory, device tensors, read-only arrays that must be written.
    """
    global _CHAR_CODES
    if _is_torch_tensor(x):
        return _torch_buffer(x, what)
    try:
        import numpy as np
    except ImportError as e:  # pragma: no cover - numpy is a dependency
        raise ValueError(f"{what}: numpy is required for non-torch buffers") from e
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what}: expected a numpy array or a torch CPU tensor, got {type(x).__name__}")
    if _CHAR_CODES is None:
        _CHAR_CODES = _numpy_codes()
    code = _CHAR_CODES.get(x.dtype.char)
    if code is None:
        name = x.dtype.name  # slow path: ml_dtypes' bfloat16, or an unsupported dtype
        if name not in DTYPES:
            raise ValueError(f"{what}: unsupported dtype {name}; supported: {', '.join(DTYPES)}")
        code = DTYPES[name]
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: array is not contiguous (pass np.ascontiguousarray(x))")
    if writable and not x.flags.writeable:
        raise ValueError(f"{what}: array is read-only but this collective writes into it")
    return Buffer(_core.buffer_address(x), int(x.size), code, x)


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
