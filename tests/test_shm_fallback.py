"""Ranks that share boot id and network namespace but not /dev/shm talk over TCP (issue 13 item 7).

A container with host networking looks exactly so: the host key says "same host", but the
peer's shared-memory segment is not in this /dev/shm. Rank 1 runs in a private mount
namespace with a fresh tmpfs on /dev/shm; the job must complete over TCP, and each rank says
so once. Needs root (CI runs as root).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from _inline import InlineJob

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="a private /dev/shm needs root and util-linux's unshare")]

PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
               'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]

BODY = """
import numpy as np, hetobs
comm = hetobs.init()
sub = comm.new_group([0, 1])  # a second communicator between the same pair
for c in (comm, sub):
    x = np.full(300000, comm.rank + 1, np.float32)  # beyond the small-message path
    for _ in range(3):
        c.all_reduce(x)
    assert np.all(x == 12), x[:4]
print("LINKS", sorted(l["transport"] for l in comm.links() + sub.links()), flush=True)
"""

WARNING = "is unusable"


def test_private_dev_shm_falls_back_to_tcp_with_one_warning(tmp_path: Path) -> None:
    with InlineJob(BODY, 2, tmp_path, transport="auto", prefix=[[], PRIVATE_SHM]) as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    for r in runs:
        assert "LINKS ['tcp', 'tcp']" in r.stdout, r.stdout
        lines = [ln for ln in r.stderr.splitlines() if "shared memory with rank" in ln and WARNING in ln]
        assert len(lines) == 1, r.stderr
        assert "uses TCP" in lines[0]


def test_forced_shm_with_a_private_dev_shm_is_an_error(tmp_path: Path) -> None:
    with InlineJob("import hetobs\nhetobs.init()\n", 2, tmp_path, transport="shm", prefix=[[], PRIVATE_SHM]) as job:
        runs = job.wait(60)
    assert all(r.returncode != 0 for r in runs)
    assert "HETOBS_TRANSPORT=shm" in runs[1].stderr, runs[1].stderr
