"""A private directory for one Open MPI job's shared-memory segments, removed with the job.

Open MPI's shared-memory transport (vader) backs each rank's segment with a file in
/dev/shm that only a clean MPI_Finalize removes: a killed job, or ranks that leave
without finalizing, leave 4 MiB per rank behind for good. Pointing the job at a directory
of its own (still on tmpfs, so the peer is measured at its usual speed) lets whoever
started it remove whatever it left.
"""

from __future__ import annotations

import os
import shutil
import tempfile

__all__ = ["MpiShmDir"]


class MpiShmDir:
    """A fresh directory under /dev/shm (else the temp dir) for one `mpirun`; `remove()` at the end."""

    def __init__(self) -> None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.path = tempfile.mkdtemp(prefix="hetobs-mpi-", dir=base)

    def mca_args(self) -> list[str]:
        """mpirun arguments that put the job's segments (point-to-point and one-sided) here."""
        return ["--mca", "btl_vader_backing_directory", self.path, "--mca", "osc_sm_backing_directory", self.path]

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
