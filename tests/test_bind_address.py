"""Listeners bind the address the job reaches a rank by, not 0.0.0.0 (issue 13 item 5).

Two "hosts" (network namespaces on a bridge); host 0 also has a second interface whose
address the other host cannot reach. A rank's listener (transport and side channel, one
port) must answer on the address toward MASTER_ADDR and refuse on the other one; with
HETOBS_SOCKET_IFNAME the listener binds, and the rank file advertises, that interface's
address. Needs root (CI runs as root).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _inline import InlineJob
from netns import NETNS_SKIP_REASON, Hosts, add_local_interface

pytestmark = [pytest.mark.slow, pytest.mark.skipif(NETNS_SKIP_REASON is not None, reason=str(NETNS_SKIP_REASON))]

OTHER_IF, OTHER_ADDR = "hx0", "10.213.7.1"

# Each rank reads its own listener's address from its rank file and dials it on every
# address given, from inside its own namespace; then the job goes on (an all_reduce).
BODY = """
import json, os, socket, numpy as np, hetobs
comm = hetobs.init()
x = np.ones(1000, np.float32)
comm.all_reduce(x)
me = json.load(open(os.path.join(os.environ["HETOBS_DIR"], os.environ["HETOBS_JOB_ID"], "ranks",
                                 f"rank-{comm.rank}.json")))["side_channel"]
seen = {}
for addr in os.environ["PROBE_ADDRS"].split(","):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((addr, me["port"]))
        seen[addr] = "open"
    except ConnectionRefusedError:
        seen[addr] = "refused"
    finally:
        s.close()
comm.barrier()
comm.all_reduce(x)
assert np.all(x == comm.size * comm.size), x[:4]
print("BIND", json.dumps({"ip": me["ip"], "seen": seen}), flush=True)
"""


def _bind_report(stdout: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("BIND "))
    return json.loads(line[5:])


def test_listener_is_not_reachable_on_another_interface(tmp_path: Path) -> None:
    with Hosts(2) as hosts:
        add_local_interface(hosts, 0, OTHER_IF, OTHER_ADDR)
        env = {"PROBE_ADDRS": ""}
        rank_env = {0: {"PROBE_ADDRS": f"{hosts.addrs[0]},{OTHER_ADDR}"}, 1: {"PROBE_ADDRS": hosts.addrs[1]}}
        with InlineJob(BODY, 2, tmp_path, env=env, rank_env=rank_env, transport="auto",
                       master_addr=hosts.addrs[0], prefix=[hosts.prefix(0), hosts.prefix(1)]) as job:
            runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    r0, r1 = (_bind_report(r.stdout) for r in runs)
    assert r0["ip"] == hosts.addrs[0] and r1["ip"] == hosts.addrs[1]
    assert r0["seen"] == {hosts.addrs[0]: "open", OTHER_ADDR: "refused"}, r0
    assert r1["seen"] == {hosts.addrs[1]: "open"}, r1


def test_socket_ifname_binds_and_advertises_that_interface(tmp_path: Path) -> None:
    with Hosts(1) as hosts:
        add_local_interface(hosts, 0, OTHER_IF, OTHER_ADDR)
        env = {"HETOBS_SOCKET_IFNAME": OTHER_IF, "PROBE_ADDRS": f"{hosts.addrs[0]},{OTHER_ADDR}"}
        with InlineJob(BODY, 2, tmp_path, env=env, transport="tcp", master_addr=hosts.addrs[0],
                       prefix=[hosts.prefix(0), hosts.prefix(0)]) as job:
            runs = job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    for r in runs:
        rep = _bind_report(r.stdout)
        assert rep["ip"] == OTHER_ADDR, rep
        assert rep["seen"] == {hosts.addrs[0]: "refused", OTHER_ADDR: "open"}, rep


def test_unknown_socket_ifname_is_one_clear_error(tmp_path: Path) -> None:
    with InlineJob("import hetobs\nhetobs.init()\n", 2, tmp_path, env={"HETOBS_SOCKET_IFNAME": "nosuchif9"},
                   transport="tcp") as job:
        runs = job.wait(60)
    for r in runs:
        assert r.returncode != 0
        assert "HETOBS_SOCKET_IFNAME='nosuchif9': no IPv4 interface" in r.stderr, r.stderr
