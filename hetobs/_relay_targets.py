"""Where a relay's buffers live, as the native relay needs to know it: an (address, bytes)
pair per buffer and, for the device stages, the device and the stream its copies follow.

Stage "cuda" is the CUDA fast path (the core dlopens libcudart; no torch per chunk).
Stage "device" serves any torch device type (npu, xpu, a PrivateUse1 device, cuda too)
through torch's device-generic API, in hetobs._torch_ext: its table is handed to the core
the first time a relay needs it. Nothing here imports torch unless a device stage is used.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["DeviceTarget", "cuda_buffer", "current_cuda_device", "cuda_stream_handle", "device_buffers",
           "device_target", "device_lanes_available"]


def cuda_buffer(x: Any, what: str) -> tuple[int, int]:
    """(address, bytes) of a device buffer: a CUDA tensor, or an (int data_ptr, int nbytes) pair."""
    if hasattr(x, "data_ptr") and getattr(x, "is_cuda", False):
        if not x.is_contiguous():
            raise ValueError(f"{what}: the CUDA tensor is not contiguous")
        return int(x.data_ptr()), int(x.numel() * x.element_size())
    if isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        ptr, nbytes = x
        if nbytes < 0 or (ptr == 0 and nbytes > 0):
            raise ValueError(f"{what}: ({ptr}, {nbytes}) is not a device buffer (null address or negative size)")
        return ptr, nbytes
    raise ValueError(f"{what}: stage='cuda' takes a CUDA tensor or an (int data_ptr, int nbytes) pair, "
                     f"got {type(x).__name__}")


def current_cuda_device() -> int:
    """The caller's current CUDA device when torch is already imported (the op may run on a worker
    thread, which is made to use the same device); -1 leaves the device as it is."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.cuda.current_device()) if torch is not None and torch.cuda.is_available() else -1
    except Exception:  # a torch without CUDA support
        return -1


def cuda_stream_handle(stream: Any) -> int:
    """cudaStream_t of `stream` (a torch.cuda.Stream, an int handle, or None: torch's current
    stream when torch with CUDA is already imported, else 0: no ordering)."""
    if stream is None:
        torch = sys.modules.get("torch")
        try:
            if torch is None or not torch.cuda.is_available():
                return 0
            stream = torch.cuda.current_stream()
        except Exception:  # a torch without CUDA support
            return 0
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
        raise ValueError(f"cuda_stream={stream!r}: expected a torch.cuda.Stream or a cudaStream_t handle (int)")
    return handle


@dataclass(frozen=True)
class DeviceTarget:
    """Stage "device": torch's DeviceType code and index of the buffers, and the stream id the
    relay's copies are ordered after (None: no ordering)."""
    device_type: int
    index: int
    stream_id: int | None


def device_buffers(items: Sequence[tuple[int, Any]], what: str, seen: list[Any]) -> list[tuple[int, int]]:
    """(address, bytes) of each item's tensor for stage "device"; every tensor is a contiguous
    tensor of one non-CPU device (appended to `seen`, the devices met so far in this relay)."""
    out = []
    for i, (_, t) in enumerate(items):
        device = getattr(t, "device", None)
        if device is None or not hasattr(t, "data_ptr"):
            raise ValueError(f"relay {what}[{i}]: stage='device' takes torch tensors, got {type(t).__name__}")
        if device.type == "cpu":
            raise ValueError(f"relay {what}[{i}]: a CPU tensor needs no staging: use stage='none' (or 'host')")
        if seen and device != seen[0]:
            raise ValueError(f"relay {what}[{i}]: on {device}, but the relay's other buffers are on {seen[0]} "
                             "(one device per relay)")
        if not t.is_contiguous():
            raise ValueError(f"relay {what}[{i}]: the tensor on {device} is not contiguous")
        seen.append(device)
        out.append((int(t.data_ptr()), int(t.numel() * t.element_size())))
    return out


def device_target(device: Any, stream: Any = None) -> DeviceTarget:
    """The target of a stage "device" relay on `device`, ordered after `stream` (a torch.Stream of
    that device; default: its current stream, so data the caller produced there is copied only
    once written, with no host synchronisation)."""
    import torch

    _ensure_device_lanes()
    if device.index is None:
        device = torch.device(device.type, torch.accelerator.current_device_index())
    if stream is None:
        stream = torch.accelerator.current_stream(device)
    if not isinstance(stream, torch.Stream) or stream.device_index != device.index:
        raise ValueError(f"stream={stream!r}: expected a torch.Stream of {device}")
    return DeviceTarget(int(stream.device_type), int(device.index), int(stream.stream_id))


def device_lanes_available() -> bool:
    """Whether stage "device" can run here (hetobs._torch_ext, built against this torch, loads)."""
    try:
        _ensure_device_lanes()
    except ValueError:
        return False
    return True


def _ensure_device_lanes() -> None:
    from . import _core

    if _core.device_lane_hooks_set():
        return
    try:
        _torch_ext = importlib.import_module("hetobs._torch_ext")  # compiled with torch, no stub
    except ImportError as e:
        raise ValueError("relay stage 'device' needs hetobs._torch_ext, the torch extension built with hetobs for "
                         f"this torch; it does not load here ({e})") from None
    _core.set_device_lane_hooks(_torch_ext.device_lane_hooks())
