"""hetobs: observable collectives.

`import hetobs` is light: it loads the native core and nothing else (never torch).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

from . import _lifecycle
from ._version import __version__
from .errors import (AuthError, CommAbortedError, DataMismatchError, HetobsError, MismatchError, OpTimeoutError,
                     PeerError)

if TYPE_CHECKING:
    from .comm import Communicator

__all__ = [
    "__version__", "init", "Communicator", "Work", "records",
    "HetobsError", "PeerError", "MismatchError", "OpTimeoutError", "CommAbortedError", "AuthError", "DataMismatchError",
]


class Store(Protocol):
    """What `init(store=...)` needs: torch.distributed's TCPStore/FileStore fit."""

    def set(self, key: str, value: bytes) -> Any: ...
    def get(self, key: str) -> bytes: ...


def _launch_int(name: str, given: int | None, found: int | None) -> int:
    if given is not None:
        return int(given)
    if found is None:
        raise ValueError(f"{name} is not set: pass {name.lower()}= to hetobs.init() or launch with torchrun, "
                         "srun or mpirun")
    return found


def init(*, rank: int | None = None, world_size: int | None = None, master_addr: str | None = None,
         master_port: int | None = None, store: Store | None = None) -> "Communicator":
    """Join the job and return the world communicator.

    Rank and world size come from the arguments, else the launcher (torchrun's RANK and
    WORLD_SIZE, srun's SLURM_PROCID and SLURM_NTASKS, mpirun's: hetobs.config.launch_from_env;
    what srun or mpirun implied is set in os.environ under torchrun's names where unset).
    Rendezvous uses `store` when given (e.g. a torch TCPStore), else MASTER_ADDR/MASTER_PORT
    (under srun: the step's first host and a port derived from the step) where rank 0 hosts a
    short-lived authenticated rendezvous during start-up only.
    """
    from .comm import Communicator
    from .config import export_launch_env

    # Exported (where unset) so the native listener binds toward the same MASTER_ADDR.
    launch = export_launch_env()
    rank = _launch_int("RANK", rank, launch.rank)
    size = _launch_int("WORLD_SIZE", world_size, launch.world_size)
    endpoint = _endpoint(rank, size)
    if store is not None:
        # A generated id differs per rank until rank 0's is adopted: it cannot name the keys.
        prefix = "hetobs/card/" if endpoint.job_id_generated else f"hetobs/{endpoint.job_id}/card/"
        native = _connect_through_store(endpoint, store, prefix, rank, size)
    else:
        addr = master_addr or launch.master_addr or "127.0.0.1"
        port = _launch_int("MASTER_PORT", master_port, launch.master_port)
        native = endpoint.native.rendezvous(addr, port)
        _lifecycle.install()  # the runtime may have started only now (agreed job id)
    return Communicator(native)


class _Endpoint:
    def __init__(self, native: Any, job_id_generated: bool) -> None:
        self.native = native
        self.job_id_generated = job_id_generated

    @property
    def job_id(self) -> str:
        """The job id: this rank's own until it is agreed at rendezvous, rank 0's after."""
        return str(self.native.job_id)


def _endpoint(rank: int, size: int, timeout: float | None = None) -> _Endpoint:
    """This process's native endpoint (listener, watchdog runtime) for a group of `size`.

    `timeout`: seconds each op of its communicator may wait on a peer (default HETOBS_TIMEOUT).
    """
    from . import _core
    from .config import from_env

    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"RANK={rank}, WORLD_SIZE={size}: need 0 <= RANK < WORLD_SIZE")
    s = from_env()
    _core.set_log_level(s.debug)
    native = _core.Endpoint(rank, size, s.job_id, s.secret, s.transport, s.timeout if timeout is None else timeout,
                            s.connect_timeout,
                            s.small_bytes, s.dir, s.hang_timeout, s.abort_on_hang, s.dump_signal, s.records,
                            s.watchdog, s.bw_log, s.bw_log_interval, s.bw_log_file,
                            job_id_generated=s.job_id_generated)
    _lifecycle.install()
    return _Endpoint(native, s.job_id_generated)


def _connect_through_store(endpoint: _Endpoint, store: Store, prefix: str, rank: int, size: int,
                           comm_id: int = 0, world_ranks: list[int] | None = None) -> Any:
    """Exchange rank cards through `store` under `prefix`, then connect.

    Rank 0 first hands out the job id and each rank adopts it before publishing its card, so
    no peer dials this rank before its listener knows the agreed key. Every communicator has
    an endpoint of its own, whose generated id is its own: for a group made after the world
    (torch's new_group) rank 0 hands out the id its process already runs under, the world's,
    so every group of the job keys its handshakes alike and writes into one job directory.
    """
    if rank == 0:
        info = _core_runtime_info()
        store.set(prefix + "job", str(info["job"] if info else endpoint.job_id).encode())
    endpoint.native.adopt_job_id(bytes(store.get(prefix + "job")).decode())
    _lifecycle.install()
    # Peers on other hosts must be able to dial the address in the card: the one this host
    # uses toward the rendezvous host (torch's MASTER_ADDR), not the loopback default.
    master = os.environ.get("MASTER_ADDR", "").strip()
    if master:
        endpoint.native.advertise_toward(master)
    store.set(prefix + str(rank), endpoint.native.card())
    cards = [bytes(store.get(prefix + str(r))) for r in range(size)]
    return endpoint.native.connect(cards, comm_id, world_ranks or [])


def _core_runtime_info() -> dict[str, Any] | None:
    from . import _core

    info = _core.runtime_info()
    return dict(info) if info is not None else None


def records() -> list[dict[str, Any]]:
    """Every op record this process holds (all communicators), oldest first.

    Keys are those of a dump entry (docs/dump-schema.md), with `island` and `phases`
    always present: None for every op but a hierarchical (island) one, whose `phases`
    dict {"vendor_ns", "d2h_ns", "wire_ns", "h2d_ns", "chunks"} is zero until it ends.
    `hetobs.stats.read_segment(...).records` have the same keys.
    """
    from . import _core

    return list(_core.records())


from . import _torch_hook  # noqa: E402 - after the public names; imports nothing heavy

_torch_hook.install()


def __getattr__(name: str) -> Any:
    # Communicator/Work load the native core; defer so `import hetobs` stays cheap.
    if name in ("Communicator", "Work"):
        from . import comm

        return getattr(comm, name)
    if name == "plan":  # hetobs.plan.report_batch(n) after a bare `import hetobs`
        import importlib

        return importlib.import_module(".plan", __name__)
    raise AttributeError(f"module 'hetobs' has no attribute {name!r}")
