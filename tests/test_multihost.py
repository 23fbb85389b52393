"""Ranks on two "hosts" (network namespaces joined by a bridge): TCP is chosen, the side
channel crosses hosts, and a hang is dumped on both sides. Needs root (CI runs as root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from _inline import InlineJob
from netns import NETNS_SKIP_REASON, Hosts
from test_watchdog import HANG, dumps

pytestmark = pytest.mark.skipif(NETNS_SKIP_REASON is not None, reason=str(NETNS_SKIP_REASON))

BODY = """
import numpy as np, hetobs, time
def waiting_in_python():
    time.sleep(3)
comm = hetobs.init()
x = np.ones(100000, np.float32)
for i in range(6):
    if i == 4 and comm.rank == 1:
        waiting_in_python()
    x[:] = 1
    comm.all_reduce(x)
    assert np.all(x == 2)
print("LINKS", [l["transport"] for l in comm.links()], flush=True)  # peers on other hosts connect on first use
"""


def test_hang_across_hosts_is_dumped_on_both_sides(tmp_path: Path) -> None:
    with Hosts(2) as hosts:
        with InlineJob(BODY, 2, tmp_path, env=HANG, transport="auto", master_addr=hosts.addrs[0],
                       prefix=[hosts.prefix(0), hosts.prefix(1)]) as job:
            runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert all("LINKS ['tcp']" in r.stdout for r in runs), "different hosts must use TCP"
    inc = dumps(job)["hang-c0-s5"]
    assert sorted(inc) == [0, 1]
    assert inc[0]["reason"] == "watchdog" and inc[0]["side_channel"]["answered"] == [1]
    assert inc[1]["reason"] == "peer_request" and inc[1]["requested_by"] == 0
    assert "in waiting_in_python" in inc[1]["python"]["stacks"]
