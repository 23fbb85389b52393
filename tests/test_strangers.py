"""Silent strangers on every listening port cost the job nothing (issue 13, item 1).

50 connections that never speak sit on the rendezvous port before and while the ranks join,
on every rank's listener (data connections and side channel) while a new communicator
connects and while `hetobs dump --job` asks every rank, and on every rank's control socket.
Each server drops a silent connection at its handshake deadline; the strangers connect again
at once, so the pressure holds throughout. The job must start, connect, dump and finish within
its ordinary (short) timeouts.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _strangers import Strangers

pytestmark = pytest.mark.slow

N = 50
CONNECT_TIMEOUT = 10.0  # a rank queued behind 50 two-second handshakes would need 100 s


SECRET = "strangers-test-secret"


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HETOBS_SECRET": SECRET})


def _rank_file(job, rank: int) -> dict:
    return json.loads((job.hetobs_dir / job.job_id / "ranks" / f"rank-{rank}.json").read_text())


def _control_socket(job_id: str, rank: int) -> str:
    h = hashlib.sha256(job_id.encode()).hexdigest()[:12]
    return f"/tmp/hetobs-{os.getuid()}/{h}-r{rank}.sock"


def _ask_unix(path: str, request: bytes, timeout: float) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(request)
        return s.recv(4096).decode()


def _wait_count(strangers: Strangers, target, n: int, job, what: str) -> None:
    """Until `n` strangers sit on `target` (bounded; each attempt waits on rank activity)."""
    end = time.monotonic() + 20
    while strangers.count(target) < n:
        assert time.monotonic() < end, f"never got {n} strangers onto {what}: {strangers.count(target)}"
        job._pump(0.05)


def test_silent_strangers_on_every_listener(launcher, tmp_path: Path) -> None:
    world = 2
    gates = [f"{g}-{r}" for g in ("strangers", "dumped") for r in range(world)] + ["join-1"]
    job = launcher("strangers", world, gates=gates, connect_timeout=CONNECT_TIMEOUT, timeout=10.0,
                   deadline=90.0, env={"HETOBS_SECRET": SECRET}, start=False)
    strangers = Strangers()
    try:
        # Before start-up: strangers wait on the rendezvous port as soon as rank 0 listens there,
        # and rank 1 joins only once all 50 are queued ahead of it.
        master = ("127.0.0.1", job.master_port)
        strangers.add(master, N)
        job.start()
        _wait_count(strangers, master, N, job, "the rendezvous port")
        job.gate_open("join-1")
        for r in range(world):
            job.wait_event(r, "joined", timeout=CONNECT_TIMEOUT + 10)
        strangers.remove(master)  # rank 0 has closed it
        # Every rank's listener (data connections, side channel) and control socket.
        for r in range(world):
            sc = _rank_file(job, r)["side_channel"]
            strangers.add((sc.get("ip", "127.0.0.1"), int(sc["port"])), N)
            strangers.add(_control_socket(job.job_id, r), N)
        for r in range(world):
            sc = _rank_file(job, r)["side_channel"]
            _wait_count(strangers, (sc.get("ip", "127.0.0.1"), int(sc["port"])), N, job, f"rank {r}'s listener")
            _wait_count(strangers, _control_socket(job.job_id, r), N, job, f"rank {r}'s control socket")
        for r in range(world):
            job.gate_open(f"strangers-{r}")
        for r in range(world):
            job.wait_event(r, "connected", timeout=CONNECT_TIMEOUT + 10)
        # During a dump: every rank answers its side channel and its control socket.
        t0 = time.monotonic()
        d = _cli("dump", "--job", job.job_id, "--dir", str(job.hetobs_dir), "--json", timeout=30)
        dump_s = time.monotonic() - t0
        assert d.returncode == 0, f"hetobs dump --job failed ({d.returncode}): {d.stdout}\n{d.stderr}"
        doc = json.loads(d.stdout)
        assert sorted(doc["answered"]) == list(range(world)), doc
        for r in range(world):
            assert _ask_unix(_control_socket(job.job_id, r), b"ping\n", 5.0).startswith(f"pong {r} ")
        for r in range(world):
            job.gate_open(f"dumped-{r}")
        results = job.wait().check()
    finally:
        reconnects = strangers.reconnects
        strangers.close()
    for res in results:
        assert res["sum"] == 3.0 and res["after"] == 2.0, res
        assert res["init_seconds"] < CONNECT_TIMEOUT and res["split_seconds"] < CONNECT_TIMEOUT, res
    # The strangers were really there: the servers kept dropping them at their handshake deadline.
    assert reconnects > 0
    print(f"init {[round(r['init_seconds'], 2) for r in results]} s, split "
          f"{[round(r['split_seconds'], 2) for r in results]} s, dump {dump_s:.2f} s, "
          f"{reconnects} stranger reconnects")
