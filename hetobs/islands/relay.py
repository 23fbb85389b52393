"""The crossing between islands: hetobs's pipelined host relay, and the phase clock.

Device tensors go device->host, over the wire, host->device, chunk by chunk through a
ring of staging slots (Communicator.relay, native): CUDA tensors through the relay's
native CUDA lane (the fast path), tensors of any other device through torch's
device-generic API (stage "device": npu, xpu, a PrivateUse1 device); host tensors go on
the wire as they are, unless HETOBS_RELAY_STAGE=host asks for a real copy through the
staging slots (how the pipeline is exercised and measured on a machine without a device).
Where hetobs._torch_ext cannot load (another torch), device tensors are staged whole in
Python instead: correct, not pipelined, said once in the log.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .._relay_targets import device_lanes_available
from ..comm import Communicator
from ..config import setting

__all__ = ["PhaseClock", "Relay", "relay_pipelined", "relay_stage"]

PHASE_KEYS = ("vendor_ns", "d2h_ns", "wire_ns", "h2d_ns", "chunks")
log = logging.getLogger("hetobs")


def relay_stage(env: Any = None) -> str:
    """HETOBS_RELAY_STAGE: auto (device tensors staged, host tensors direct), host (host tensors
    staged too) or device (CUDA tensors through the device-generic lane too)."""
    return str(setting("HETOBS_RELAY_STAGE", env))


def relay_pipelined(env: Any = None) -> bool:
    """HETOBS_RELAY_PIPELINE: 1 (chunks overlap) or 0 (copy all, send all, copy all)."""
    return setting("HETOBS_RELAY_PIPELINE", env) == "1"


@dataclass
class PhaseClock:
    """Where one hierarchical op spent its time (what its record's `phases` carry); tells
    the record which phase the op is in as it goes (`on_phase`, e.g. ExternalComm.set_phase)."""

    on_phase: Callable[[str], None] | None = None
    vendor_ns: int = 0
    d2h_ns: int = 0
    wire_ns: int = 0
    h2d_ns: int = 0
    chunks: int = 0

    def enter(self, phase: str) -> None:
        if self.on_phase is not None:
            self.on_phase(phase)

    def vendor(self, call: Callable[..., int], *args: Any) -> None:
        """Run one collective of the island's library (`call` returns its ns)."""
        self.enter("vendor")
        self.vendor_ns += call(*args)

    def wire(self, call: Callable[..., Any], *args: Any) -> None:
        """Run one native collective between islands (host memory: no copies, all wire)."""
        self.enter("wire")
        t0 = time.perf_counter_ns()
        call(*args)
        self.wire_ns += time.perf_counter_ns() - t0

    def add_relay(self, phases: dict[str, int]) -> None:
        self.d2h_ns += int(phases.get("d2h_ns", 0))
        self.wire_ns += int(phases.get("wire_ns", 0))
        self.h2d_ns += int(phases.get("h2d_ns", 0))
        self.chunks += int(phases.get("chunks", 0))

    def as_dict(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in PHASE_KEYS}


@dataclass
class Relay:
    """Moves tensors between ranks of different islands over the native world communicator."""

    comm: Communicator
    staged_host: bool = False     # HETOBS_RELAY_STAGE=host
    pipeline: bool = True         # HETOBS_RELAY_PIPELINE
    generic_cuda: bool = False    # HETOBS_RELAY_STAGE=device
    _warned: bool = field(default=False, init=False, repr=False)

    def _stage(self, ts: list[torch.Tensor]) -> str:
        devices = {t.device for t in ts}
        if len(devices) > 1:
            raise ValueError(f"the host relay moves tensors of one device per op (got {sorted(map(str, devices))})")
        device = next(iter(devices))
        if device.type == "cpu":
            return "host" if self.staged_host else "none"
        if device.type == "cuda" and not self.generic_cuda:
            return "cuda"
        if device_lanes_available():
            return "device"
        if not self._warned:
            log.warning("hetobs relay: %s tensors are staged whole in Python (hetobs._torch_ext does not load for "
                        "this torch): correct, but copies and wire do not overlap", device.type)
            self._warned = True
        return "python"

    def run(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]],
            clock: PhaseClock) -> None:
        """Move every send to its peer and fill every recv from its peer (group ranks), at once."""
        sends = [(p, t) for p, t in sends if t.numel()]
        recvs = [(p, t) for p, t in recvs if t.numel()]
        if not sends and not recvs:
            return
        stage = self._stage([t for _, t in sends] + [t for _, t in recvs])
        clock.enter("relay")
        if stage == "python":
            clock.add_relay(self._staged_in_python(sends, recvs))
            return
        # Device stages order their copies after the caller's current stream on the device (no
        # host synchronisation), and return once the received data is in device memory.
        clock.add_relay(self.comm.relay(sends, recvs, stage=stage, pipeline=self.pipeline))

    def _staged_in_python(self, sends: list[tuple[int, torch.Tensor]],
                          recvs: list[tuple[int, torch.Tensor]]) -> dict[str, int]:
        t0 = time.perf_counter_ns()
        host_sends = [(p, t.to("cpu")) for p, t in sends]
        host_recvs = [(p, torch.empty(t.shape, dtype=t.dtype)) for p, t in recvs]
        t1 = time.perf_counter_ns()
        phases = self.comm.relay(host_sends, host_recvs, stage="none")
        t2 = time.perf_counter_ns()
        for (_, t), (_, h) in zip(recvs, host_recvs, strict=True):
            t.copy_(h)
        t3 = time.perf_counter_ns()
        return {"d2h_ns": t1 - t0, "wire_ns": t2 - t1, "h2d_ns": t3 - t2, "chunks": phases.get("chunks", 0)}
