"""TCP data links ask for a large send buffer (kTcpSendBuffer, 4 MiB; the kernel caps the request
at net.core.wmem_max and doubles it) instead of autotuning's, which stops at tcp_wmem's maximum;
the kernel's own view of each link's socket (`ss -tm`: skmem tb) says what it granted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from _inline import InlineJob

pytestmark = pytest.mark.slow

BODY = r"""
import json, re, subprocess, numpy as np, hetobs
comm = hetobs.init()
x = np.ones(1000, np.float32)
comm.all_reduce(x)
out = []
for link in comm.links():
    if link["transport"] != "tcp":
        continue
    ss = subprocess.run(["ss", "-Htmn", "state", "established", "src", link["local_address"],
                         "dst", link["remote_address"]], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\btb(\d+)", ss)
    out.append({"peer": link["peer"], "tb": int(m.group(1)) if m else None, "ss": ss})
comm.barrier()  # every rank read its links before any closes one
print(json.dumps({"links": out, "ok": x.tolist() == [float(comm.size)] * 1000}))
comm.close()
"""


def _int(path: str) -> int:
    return int(Path(path).read_text().split()[-1])


def test_tcp_links_get_a_large_send_buffer(core: Any, tmp_path: Path) -> None:
    if not shutil.which("ss"):
        pytest.skip("needs ss (iproute2)")
    granted = 2 * min(4 << 20, _int("/proc/sys/net/core/wmem_max"))  # the kernel doubles the request
    autotune_max = _int("/proc/sys/net/ipv4/tcp_wmem")
    if granted <= autotune_max:
        pytest.skip(f"wmem_max lets autotuning reach {autotune_max} B: cannot tell an explicit buffer from it")
    with InlineJob(BODY, 3, tmp_path, transport="tcp") as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["ok"], r.rank
        assert sorted(link["peer"] for link in out["links"]) == sorted(set(range(3)) - {r.rank}), out
        for link in out["links"]:
            assert link["tb"] == granted, (r.rank, link)


PIPELINE_BODY = r"""
import json, numpy as np, hetobs
comm = hetobs.init()
x = np.full(1 << 20, comm.rank + 1.0, np.float32)  # 4 MiB: three ring blocks of three segments
comm.all_reduce(x)
links = {link["peer"]: link["sends_unacked_max"] for link in comm.links() if link["transport"] == "tcp"}
print(json.dumps({"links": links, "ok": bool(np.all(x == 6.0))}))
comm.close()
"""


def test_ring_all_reduce_over_tcp_keeps_several_chunks_in_flight(core: Any, tmp_path: Path) -> None:
    """With reconnect on (the default) a ring step's segments go out without waiting for the
    peer's ack of the one before: the link to the right neighbour holds several written,
    unacknowledged send items at once (before pipelining, a collective send waited for its
    ack, so never more than one). Counted when written, before any ack is read: no timing."""
    with InlineJob(PIPELINE_BODY, 3, tmp_path, transport="tcp") as job:
        runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-3000:] for r in runs]
    for r in runs:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["ok"], r.rank
        assert out["links"][str((r.rank + 1) % 3)] >= 2, (r.rank, out)
