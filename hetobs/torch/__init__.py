"""torch.distributed integration. Importing this module imports torch; `import hetobs` does not.

- `dist.init_process_group("hetobs")`: the native transport as a torch backend.
- `"hetobs_gloo"` / `"hetobs_nccl"`: Gloo / NCCL for the data path, instrumented by hetobs.
- `hetobs.torch.wrap(group)`: instrument a group created elsewhere.
- `"hetobs_islands"`: one job across islands of different accelerators and libraries
  (hetobs/islands/).

The backends are registered by `register()`, which `import hetobs` arranges to run as
soon as `torch.distributed` is imported (see hetobs/_torch_hook.py). It also sets the
torchrun variables an srun or mpirun launch implies (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT; hetobs.config.export_launch_env) where unset, so
`init_process_group` with its default env:// rendezvous works under srun unchanged.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

from .native_backend import HetobsBackend
from .wrapped_backend import InstrumentedBackend, native_wrapper, wrap

__all__ = ["register", "wrap", "native_wrapper", "HetobsBackend", "InstrumentedBackend"]

log = logging.getLogger("hetobs")

_registered = False


def register() -> None:
    """Register the hetobs backends with torch.distributed (idempotent)."""
    global _registered
    if _registered:
        return
    from ..islands import backend as islands_backend
    from . import native_backend, wrapped_backend

    for name, creator, devices in (("hetobs", native_backend.create, ["cpu", "cuda"]),
                                   ("hetobs_gloo", wrapped_backend.create_gloo, ["cpu"]),
                                   ("hetobs_nccl", wrapped_backend.create_nccl, ["cuda"]),
                                   ("hetobs_islands", islands_backend.create, ["cpu", "cuda"])):
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, creator, extended_api=True, devices=devices)
    _registered = True
    from ..config import SettingError, export_launch_env

    try:
        export_launch_env()
    except SettingError as e:  # torch's own rendezvous then says what it lacks
        log.warning("hetobs: launcher variables not usable: %s", e)


# Imported first (`import hetobs.torch`), this package's own import of torch.distributed ran the
# hook while `register` did not exist yet (hetobs/_torch_hook.py leaves it to us): register now.
register()
