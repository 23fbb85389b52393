"""A stand-in accelerator for tests and benchmarks: torch device "standin" and its
collective library "sccl". NOT a real device.

No vendor accelerator (Ascend, Kunlun, ...) runs on the machines hetobs is tested on, yet
hetobs's islands must work for any torch device outside torch's tree. This package plays
one, through the same mechanism the vendors use (PrivateUse1 renamed, a registered device
module, a c10d backend plugin):

- device memory is not host memory (a device tensor's data_ptr() faults when host code
  reads it), so whatever crosses to or from it must be copied by the device;
- host<->device copies run asynchronously on copy engines, ordered by streams and events,
  paced at a settable bandwidth (STANDIN_COPY_GBPS, or STANDIN_H2D_GBPS / STANDIN_D2H_GBPS;
  0, the default, is unpaced): a paced engine sleeps instead of using a core, as DMA does;
- copies from or to pinned host memory may be asynchronous; pageable ones are synchronous;
- "sccl" is registered as the device's collective library (as torch_npu registers hccl).

What it does not model: device compute time (kernels run on the host, synchronously, via
a CPU fallback), memory limits, device-to-device networks, a random number generator.
See docs/islands.md, "The stand-in accelerator".

    import hetobs_standin        # registers the device "standin" and the backend "sccl"
    x = torch.ones(4).to("standin")
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

from . import _C

__all__ = ["DEVICE", "BACKEND", "set_copy_bandwidth", "engine_stats", "device_bytes_in_use", "host_waits"]

DEVICE = "standin"
BACKEND = "sccl"


class _DeviceModule:
    """torch.standin: what torch's device-generic code looks up on a device module."""

    @staticmethod
    def is_available() -> bool:
        return _C.device_count() > 0

    @staticmethod
    def device_count() -> int:
        return _C.device_count()

    @staticmethod
    def current_device() -> int:
        return _C.current_device()

    @staticmethod
    def set_device(device: Any) -> None:
        _C.set_device(torch.device(DEVICE, device).index if isinstance(device, int) else torch.device(device).index)

    @staticmethod
    def synchronize(device: Any = None) -> None:
        _C.synchronize(-1 if device is None else torch.device(DEVICE, device).index
                       if isinstance(device, int) else torch.device(device).index or 0)

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """No generator on the device: random tensors are made on the CPU (see the module doc)."""

    @staticmethod
    def current_stream(device: Any = None) -> torch.Stream:
        return torch.accelerator.current_stream(device)


def set_copy_bandwidth(h2d_gbps: float, d2h_gbps: float | None = None) -> None:
    """Pace every device's copy engines (GB/s; 0 unpaced); d2h defaults to h2d."""
    _C.set_copy_bandwidth(float(h2d_gbps), float(h2d_gbps if d2h_gbps is None else d2h_gbps))


def engine_stats(device: int = 0) -> dict[str, dict[str, float]]:
    """Bytes, copies and busy ns of the device's two copy engines since the process started."""
    return dict(_C.engine_stats(device))


def device_bytes_in_use() -> int:
    return int(_C.device_bytes_in_use())


def host_waits(stream: torch.Stream) -> int:
    """Times a host thread blocked on `stream` (synchronize, a blocking copy): a test of
    device-side ordering checks that a call left this unchanged."""
    return int(_C.host_waits(stream.device_index, stream.stream_id))


def _create_sccl(opts: Any, backend_options: Any = None) -> Any:
    """torch.distributed's extended-API creator for "sccl": the collective library of the
    stand-in device, carried over a Gloo group of host memory."""
    import torch.distributed as dist

    timeout = opts.timeout if isinstance(opts.timeout, datetime.timedelta) else datetime.timedelta(minutes=30)
    host = dist.ProcessGroupGloo(dist.PrefixStore("sccl-host/", opts.store), opts.group_rank, opts.group_size,
                                 timeout)
    return _C.make_sccl(host, opts.group_rank, opts.group_size)


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != DEVICE:
        torch.utils.rename_privateuse1_backend(DEVICE)
    if not hasattr(torch, DEVICE):
        torch._register_device_module(DEVICE, _DeviceModule())
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    import torch.distributed as dist

    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create_sccl, extended_api=True, devices=[DEVICE])


_register()
