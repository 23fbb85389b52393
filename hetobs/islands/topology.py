"""Which island each rank belongs to, agreed by every rank through the store.

An island is a set of ranks that share an accelerator type and a collective library
(NVIDIA GPUs with NCCL, Ascend NPUs with HCCL, CPUs with Gloo, ...). A rank names its
island with HETOBS_ISLAND (default: its device type), its device with
HETOBS_ISLAND_DEVICE (default: torch's current accelerator, else cpu) and the library
inside it with HETOBS_ISLAND_BACKEND (default: the library torch maps to that device).
Devices are whatever torch knows: in-tree ones and those vendors plug in through
PrivateUse1; nothing here names a vendor but the fallback table. Islands are
whatever ranks share a name: they need not be contiguous in rank order, and they may
differ in size and library.

Every rank publishes its (island, backend, device) under the group's store prefix and
reads everyone's, so all ranks build the same Topology: islands ordered by their
lowest rank, members by rank. That order is the order partial results are folded in,
so every rank computes bit-identical results.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..config import SettingError, setting

__all__ = ["DEFAULT_BACKENDS", "Island", "IslandError", "Topology", "local_identity", "exchange"]

# The collective library usually found with each device type (torch.distributed names).
DEFAULT_BACKENDS: dict[str, str] = {"cuda": "nccl", "npu": "hccl", "xpu": "xccl", "cpu": "gloo"}
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # fits the records' island field (15 bytes + NUL)


class IslandError(ValueError):
    """A rank's island settings cannot be used (the message names the setting and the rank)."""


@dataclass(frozen=True)
class Island:
    index: int                 # position in the job's island order (by lowest member rank)
    name: str
    backend: str               # torch.distributed backend name inside the island
    device: str                # device type of its tensors: cuda, npu, xpu, cpu
    members: tuple[int, ...]   # group ranks, ascending

    @property
    def size(self) -> int:
        return len(self.members)

    def rank_of(self, group_rank: int) -> int:
        return self.members.index(group_rank)


@dataclass(frozen=True)
class Topology:
    islands: tuple[Island, ...]
    island_of: tuple[int, ...]  # group rank -> island index

    @property
    def size(self) -> int:
        return len(self.island_of)

    def of(self, group_rank: int) -> Island:
        return self.islands[self.island_of[group_rank]]

    @staticmethod
    def build(entries: Sequence[Mapping[str, str]]) -> "Topology":
        """From every rank's published identity (index = group rank)."""
        order: list[str] = []
        members: dict[str, list[int]] = {}
        first: dict[str, Mapping[str, str]] = {}
        for rank, e in enumerate(entries):
            if e.get("relay", "") != entries[0].get("relay", ""):
                # Both ends of every crossing must take the same path and cut alike.
                raise IslandError(f"HETOBS_RELAY_STAGE / HETOBS_RELAY_PIPELINE differ: rank {rank} has {e['relay']}, "
                                  f"rank 0 has {entries[0]['relay']} (every rank of the job must agree)")
            name = e["island"]
            if name not in members:
                order.append(name)
                members[name] = []
                first[name] = e
            elif (e["backend"], e["device"]) != (first[name]["backend"], first[name]["device"]):
                f = first[name]
                raise IslandError(
                    f"island {name!r}: rank {rank} has backend {e['backend']!r} on {e['device']!r}, but rank "
                    f"{members[name][0]} has {f['backend']!r} on {f['device']!r} (one island, one library: "
                    "check HETOBS_ISLAND / HETOBS_ISLAND_BACKEND on both)")
            members[name].append(rank)
        islands = tuple(Island(i, n, first[n]["backend"], first[n]["device"], tuple(members[n]))
                        for i, n in enumerate(order))
        island_of = [0] * len(entries)
        for isl in islands:
            for r in isl.members:
                island_of[r] = isl.index
        return Topology(islands, tuple(island_of))


def _accelerator() -> str:
    """torch's current accelerator (cuda, xpu, a PrivateUse1 device a vendor plugin registered,
    ...) when one is available, else cpu: device-generic, no vendor named."""
    import torch

    try:
        acc = torch.accelerator.current_accelerator(check_available=True)
    except Exception:  # a half-installed vendor plugin: no usable accelerator
        return "cpu"
    return acc.type if acc is not None else "cpu"


def _device_available(device: str) -> bool:
    import torch

    if device == "cpu":
        return True
    try:
        return torch.device(device).type == device and torch.accelerator.device_count() > 0 and \
            _accelerator() == device
    except (RuntimeError, ValueError):  # torch knows no such device type here
        return False


def _default_backend(device: str) -> str:
    """The library torch maps to the device (its own table, which vendor plugins extend when
    they register: torch_npu's hccl for npu, the stand-in's sccl for standin, ...)."""
    import torch.distributed as dist

    return dist.Backend.default_device_backend_map.get(device) or DEFAULT_BACKENDS.get(device, "gloo")


def _carries(backend: str, device: str) -> str | None:
    """Why `backend` cannot carry tensors of `device` inside an island, or None when it can."""
    import torch.distributed as dist

    if backend == "hetobs":
        return None if device == "cpu" else "the native transport inside an island moves host (cpu) tensors only"
    if backend == "mpi":
        return ("torch's MPI backend cannot form a group of one island's ranks (its group is MPI_COMM_WORLD): "
                "use gloo for a cpu island")
    if backend in ("gloo", "nccl", "ucc", "xccl"):
        devices = dist.Backend.backend_capability.get(backend, [])
    else:
        plugin = dist.Backend._plugins.get(backend.upper())
        if plugin is None:
            return (f"torch.distributed has no backend {backend!r} here (is the vendor's torch plugin imported "
                    "before init_process_group?)")
        devices = dist.Backend.backend_capability.get(backend, [])
    return None if device in devices else f"{backend} carries {', '.join(devices) or 'no device'} tensors, not {device}"


def local_identity(env: Mapping[str, str] | None = None, rank: int | None = None) -> dict[str, str]:
    """This rank's island, backend and device (HETOBS_ISLAND, HETOBS_ISLAND_BACKEND,
    HETOBS_ISLAND_DEVICE), checked: the device is available here and the backend carries it."""
    env = os.environ if env is None else env
    who = f"rank {rank}" if rank is not None else "this rank"
    try:
        device = setting("HETOBS_ISLAND_DEVICE", env).strip().lower() or _accelerator()
        island = setting("HETOBS_ISLAND", env).strip() or device
        backend = setting("HETOBS_ISLAND_BACKEND", env).strip().lower()
        # Published and compared across ranks (one relay mode per job), checked here first so a
        # bad value fails at the exchange, where every rank hears of it.
        relay = {"stage": setting("HETOBS_RELAY_STAGE", env), "pipeline": setting("HETOBS_RELAY_PIPELINE", env)}
    except SettingError as e:
        raise IslandError(f"{e} ({who})") from None
    if not _NAME.match(island):
        raise IslandError(f"HETOBS_ISLAND={island!r}: an island name is 1-15 letters, digits, '_', '.' or '-'")
    if not _NAME.match(device):
        raise IslandError(f"HETOBS_ISLAND_DEVICE={device!r}: expected a torch device type (cuda, npu, xpu, cpu, ...)")
    backend = backend or _default_backend(device)
    if not _NAME.match(backend):
        raise IslandError(f"HETOBS_ISLAND_BACKEND={backend!r}: expected a torch.distributed backend name "
                          "(nccl, hccl, xccl, gloo, hetobs, ...)")
    if backend == "hetobs_islands":
        raise IslandError("HETOBS_ISLAND_BACKEND='hetobs_islands': the library inside an island cannot be "
                          "the islands backend itself")
    if not _device_available(device):
        raise IslandError(f"island {island!r}: {who} has no {device} device available (backend {backend}); is the "
                          f"vendor's torch plugin imported and the device visible to this process?")
    why = _carries(backend, device)
    if why:
        raise IslandError(f"island {island!r}: {who} cannot run backend {backend} on {device}: {why}")
    return {"island": island, "backend": backend, "device": device, "relay": json.dumps(relay, sort_keys=True)}


def exchange(store: Any, prefix: str, rank: int, size: int, env: Mapping[str, str] | None = None) -> Topology:
    """Publish this rank's identity and read every rank's through `store` (torch Store API).

    A rank whose settings are unusable publishes its error before raising, so the other
    ranks fail at once with it instead of waiting for an identity that never comes.
    """
    try:
        me: dict[str, str] = local_identity(env, rank)
    except IslandError as e:
        store.set(f"{prefix}{rank}", json.dumps({"error": str(e)}))
        raise
    store.set(f"{prefix}{rank}", json.dumps(me))
    entries: list[dict[str, str]] = []
    for r in range(size):
        raw = bytes(store.get(f"{prefix}{r}"))
        try:
            published = json.loads(raw)
            error = published.get("error")
            entry = None if error else {k: str(published[k]) for k in ("island", "backend", "device", "relay")}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise IslandError(f"rank {r} published an unreadable island identity under {prefix}{r}") from None
        if entry is None:
            raise IslandError(f"rank {r} cannot join the islands: {error}")
        entries.append(entry)
    return Topology.build(entries)
