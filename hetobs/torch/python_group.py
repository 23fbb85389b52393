"""What every collective backend hetobs writes in Python shares (`hetobs`, `hetobs_islands`).

torch's C++ ProcessGroup base class answers what such a group does not define by looking for
a backend registered per device type, which a group written in Python has none of: users got
"No backend type associated with device type cpu" for coalesced ops, receives from any
source and monitored barriers, and "missing 1 required positional argument: 'opts'" for
direct calls such as `group.allreduce([t]).get_future()` (DDP communication hooks). Found by
torch's own distributed test suite (docs/conformance.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch

from ._common import NamedGroup, done

__all__ = ["PythonGroup", "or_default", "group_timeout"]


def or_default(opts: Any, kind: Callable[[], Any]) -> Any:
    """The options torch passed, or torch's defaults for a direct call (`group.allreduce([t])`, as the
    C++ ProcessGroup takes it: sum, root 0)."""
    return kind() if opts is None else opts


def group_timeout(timeout: Any) -> float | None:
    """The op timeout a group was made with, in seconds; None for torch's default (30 min), which
    leaves HETOBS_TIMEOUT in charge. torch documents `timeout` of init_process_group and new_group
    as the timeout of the group's operations, as Gloo takes it."""
    from torch.distributed.constants import default_pg_timeout

    if not isinstance(timeout, timedelta) or timeout == default_pg_timeout or timeout.total_seconds() <= 0:
        return None
    return timeout.total_seconds()


class PythonGroup(NamedGroup):
    """Coalesced ops as one op after another (every op of these groups runs to completion before it
    returns, so that is what coalescing means here), and one-line refusals of what hetobs does
    not do. Subclasses define allgather, all_gather_single and reduce_scatter_single. Put before
    dist.ProcessGroup in the bases."""

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> Any:
        # outputs[r][i] gets rank r's inputs[i]: allgather's outputs[i][r], transposed.
        self.allgather([[per_rank[i] for per_rank in outputs] for i in range(len(inputs))], inputs, opts)  # type: ignore[attr-defined]
        return done(outputs)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> Any:
        return self._pairwise(self.all_gather_single, outputs, inputs, opts)  # type: ignore[attr-defined]

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        return self._pairwise(self.reduce_scatter_single, outputs, inputs, opts)  # type: ignore[attr-defined]

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @staticmethod
    def _pairwise(op: Any, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        for out, inp in zip(outputs, inputs, strict=True):
            op(out, inp, opts)
        return done(outputs)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        raise ValueError("hetobs receives from a named peer only: recv from any source is not supported "
                         "(pass src= to recv/irecv)")

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
        raise ValueError("monitored_barrier is Gloo's (torch.distributed.monitored_barrier refuses every other "
                         "backend by name); on hetobs use barrier(): an op that times out names the rank it "
                         "waited for (HETOBS_TIMEOUT), and the watchdog dumps a barrier that hangs")
