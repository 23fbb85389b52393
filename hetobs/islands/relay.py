"""The crossing between islands: hetobs's pipelined host relay, and the phase clock.

Device tensors go device->host, over the wire, host->device, chunk by chunk through a
ring of staging slots (Communicator.relay, native); host tensors go on the wire as
they are, unless HETOBS_RELAY_STAGE=host asks for a real copy through the staging
slots (how the pipeline is exercised and measured on a machine without a GPU).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..comm import Communicator

__all__ = ["PhaseClock", "Relay", "relay_pipelined", "relay_stage"]

PHASE_KEYS = ("vendor_ns", "d2h_ns", "wire_ns", "h2d_ns", "chunks")


def _choice(env: Any, name: str, default: str, choices: tuple[str, ...]) -> str:
    from ..config import SettingError

    raw = (os.environ if env is None else env).get(name, default)
    value = raw.strip().lower()
    if value not in choices:
        raise SettingError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return value


def relay_stage(env: Any = None) -> str:
    """HETOBS_RELAY_STAGE: auto (device tensors staged, host tensors direct) or host."""
    return _choice(env, "HETOBS_RELAY_STAGE", "auto", ("auto", "host"))


def relay_pipelined(env: Any = None) -> bool:
    """HETOBS_RELAY_PIPELINE: 1 (chunks overlap) or 0 (copy all, send all, copy all)."""
    return _choice(env, "HETOBS_RELAY_PIPELINE", "1", ("0", "1")) == "1"


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
    staged_host: bool = False  # HETOBS_RELAY_STAGE=host
    pipeline: bool = True      # HETOBS_RELAY_PIPELINE

    def _stage(self, ts: list[torch.Tensor]) -> str:
        kinds = {t.device.type for t in ts}
        if kinds == {"cpu"}:
            return "host" if self.staged_host else "none"
        if kinds == {"cuda"}:
            return "cuda"
        raise ValueError(f"the host relay moves cpu or cuda tensors, one kind per op (got {sorted(kinds)})")

    @staticmethod
    def _buffer(t: torch.Tensor, stage: str) -> Any:
        if stage == "cuda":
            return (int(t.data_ptr()), int(t.numel() * t.element_size()))
        return t

    def run(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]],
            clock: PhaseClock) -> None:
        """Move every send to its peer and fill every recv from its peer (group ranks), at once."""
        sends = [(p, t) for p, t in sends if t.numel()]
        recvs = [(p, t) for p, t in recvs if t.numel()]
        if not sends and not recvs:
            return
        stage = self._stage([t for _, t in sends] + [t for _, t in recvs])
        clock.enter("relay")
        if stage == "cuda":
            # The data was produced on torch's current stream; the relay copies on its own
            # streams. A stream sync (never a device-wide one) orders the two.
            torch.cuda.current_stream().synchronize()
        phases = self.comm.relay([(p, self._buffer(t, stage)) for p, t in sends],
                                 [(p, self._buffer(t, stage)) for p, t in recvs], stage=stage,
                                 pipeline=self.pipeline)
        clock.add_relay(phases)

