"""Instrument a vendor process group (Gloo, NCCL): the job keeps its data path and gets
hetobs's records, counters, watchdog and dumps.

Backend names `"hetobs_gloo"` / `"hetobs_nccl"` (no colon: torch reads "a:b" as
device:backend) create the vendor group and wrap it; `hetobs.torch.wrap(group)` wraps
a group made elsewhere. Every op is recorded in an ExternalComm (native) before it is
handed to the vendor group and finished when it completes.

The wrapper is hetobs._torch_ext (C++, csrc/torch_ext/): a c10d Backend that torch
dispatches to like to Gloo itself, ending each record from the vendor future's
callback, from wait(), or, for device ops, from a poller asking the op's CUDA event.
Where that module is missing or was built for another torch, the Python fallback in
python_wrapper.py does the same (a few to ~25 us more per small op). While an op waits, the native
watchdog sees it in flight, so a hang inside Gloo or NCCL is dumped and diagnosed like
a native one.
"""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import _connect_through_store, _core, _endpoint, codes
from ..config import from_env
from ..comm import Communicator
from ._common import comm_id_for
from .python_wrapper import InstrumentedBackend

__all__ = ["InstrumentedBackend", "create_gloo", "create_nccl", "wrap", "native_wrapper"]

log = logging.getLogger("hetobs")

_BACKEND_CODES = {name: codes.BACKEND_CODES[name] for name in ("gloo", "nccl", "mpi")}  # the vendors wrap() takes


@functools.cache
def native_wrapper() -> Any:
    """hetobs._torch_ext when it was built for the running torch's release, else None."""
    if not from_env().torch_native:
        return None
    try:
        from .. import _torch_ext
    except ImportError as e:  # built without torch (HETOBS_TORCH_EXT=OFF), or cannot load
        log.warning("hetobs._torch_ext is not available (%s): torch wrappers run in Python (a few to ~25 us "
                    "more per small op); docs/torch.md says how the wheel builds it", e)
        return None
    # The release, not the local tag: the wheel's wrapper is built against the CPU wheel of
    # torch 2.13.0 ("2.13.0+cpu") and serves its CUDA build ("2.13.0", "2.13.0+cu128") alike
    # (the c10d Backend and Work classes it subclasses have no build-dependent layout).
    if _release(_torch_ext.TORCH_VERSION) != _release(torch.__version__):
        log.warning("hetobs._torch_ext was built for torch %s, this is %s: torch wrappers run in Python "
                    "(a few to ~25 us more per small op); reinstall hetobs to rebuild it", _torch_ext.TORCH_VERSION,
                    torch.__version__)
        return None
    return _torch_ext


def _release(version: str) -> str:
    return str(version).split("+", 1)[0]


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
    backend = _instrument(inner, ext, vendor)
    native = native_wrapper()
    # NCCL's backend goes back to torch as it is: torch binds the group it made to the device
    # given to init_process_group (bound_device_id, eager NCCL init), which a group of our
    # own would not carry.
    if native is None or vendor != "gloo":
        return backend
    return _named_group(native, opts.store, rank, size, "hetobs_gloo", {"cpu": backend})


def _named_group(native: Any, store: Any, rank: int, size: int, name: str, backends: dict[str, Any]) -> Any:
    """A torch ProcessGroup over `backends` (device type -> instrumented c10d backend) whose
    getBackendName() is `name`, where torch's own group for a plugin says "custom" (DDP's
    logging data, torch's messages). torch takes a ProcessGroup from a creator as it is."""
    group = native.named_group(store, rank, size, name)
    custom = dist.ProcessGroup.BackendType.CUSTOM
    for device, backend in backends.items():
        group._register_backend(torch.device(device), custom, backend)
    group._set_default_backend(custom)
    return group


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
