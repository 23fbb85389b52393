"""The native relay (Communicator.relay): the cross-island transfer of heterogeneous jobs.

Real rank processes and sockets / shared memory. Stage "cuda" runs against the stand-in CUDA
runtime tests/nccl/fake_cudart.c because this machine has no GPU and no CUDA: its "device"
memory is host memory and cudaMemcpyAsync a memcpy, so these tests check the relay's CUDA
path (pinned staging, copies on non-blocking streams, events, no device-wide sync), not a GPU.
Rank bodies are in tests/relay_programs.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Launcher, LeakCheck

NCCL_TESTS = Path(__file__).resolve().parent / "nccl"


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the stand-in libcudart.so.12 (put it on LD_LIBRARY_PATH)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc) to build the CUDA stand-in tests/nccl/fake_cudart.c")
    d = tmp_path_factory.mktemp("fake-cuda")
    subprocess.run([cc, "-O1", "-Wall", "-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-o", "libcudart.so.12",
                    str(NCCL_TESTS / "fake_cudart.c")], check=True, cwd=d)
    return d


def _names_rank(msg: str, rank: int) -> bool:
    return re.search(rf"\brank {rank}\b", msg) is not None


@pytest.mark.parametrize("world,transport", [(2, "shm"), (2, "tcp"), (3, "shm"), (3, "tcp")])
def test_relay_is_bit_exact(launcher: Launcher, leak_check: LeakCheck, fake_cuda: Path, world: int,
                            transport: str) -> None:
    """Every rank relays five messages to each other rank and from it (0 B, 1 B, odd sizes, one of
    ~37 chunks; sizes differ by direction), through every stage, pipelined and not, sync and async:
    every byte lands where it should, and the phases count what moved."""
    job = launcher("relay", world, {"case": "matrix", "stages": ["none", "host", "cuda"], "chunk": 4096,
                                    "slots": 3}, transport=transport, timeout=20.0, deadline=90.0,
                   env={"LD_LIBRARY_PATH": str(fake_cuda)})
    results = job.wait(timeout=90).check()
    for r in results:
        assert r["problems"] == [], f"rank {r['rank']}: {r['problems']}"
        assert r["runs"] == 8
        # one record per relay, p2p-style (no collective seq), numbered 1.. on every rank
        assert r["relay_records"] == 8 and r["states"] == ["completed"], r
        assert r["p2p_seqs"] == list(range(1, 9)), r["p2p_seqs"]
        cuda = r["cuda"]
        assert cuda["memcpy_async"] > 0 and cuda["memcpy_async_blocking"] == 0, cuda  # own non-blocking streams
        assert cuda["host_allocs"] >= 2, cuda  # pinned staging
        assert cuda["device_syncs"] == 0, cuda  # never cudaDeviceSynchronize
        assert cuda["stream_waits"] >= 4, cuda  # copies ordered after the caller's stream, device-side


def test_chunk_and_slot_settings_are_honoured(launcher: Launcher, leak_check: LeakCheck) -> None:
    n = (1 << 20) + 1
    job = launcher("relay", 2, {"case": "env_chunks", "n": n}, transport="shm",
                   env={"HETOBS_RELAY_CHUNK_BYTES": "65536", "HETOBS_RELAY_SLOTS": "2"})
    for r in job.wait(timeout=60).check():
        assert r["exact"], r
        assert r["phases"]["chunks"] == 2 * 17, r["phases"]  # 16 full chunks + 1 byte, each way


@pytest.mark.parametrize("stage", ["none", "host"])
def test_size_mismatch_names_the_peer(launcher: Launcher, leak_check: LeakCheck, stage: str) -> None:
    job = launcher("relay", 2, {"case": "mismatch", "stage": stage}, transport="tcp", timeout=10.0)
    for r in job.wait(timeout=60).check():
        err, other = r["error"], 1 - r["rank"]
        assert err is not None and "MismatchError" in err["mro"], r
        assert _names_rank(err["msg"], other), err["msg"]
        assert "100 bytes" in err["msg"] and "101 bytes" in err["msg"], err["msg"]


@pytest.mark.parametrize("transport,stage", [("shm", "host"), ("tcp", "host"), ("tcp", "none")])
def test_killed_peer_mid_relay_raises_naming_it(launcher: Launcher, leak_check: LeakCheck, transport: str,
                                                stage: str) -> None:
    job = launcher("relay", 2, {"case": "kill", "stage": stage}, transport=transport, timeout=10.0, deadline=60.0)
    job.wait_event(1, "looping", timeout=40)
    t_kill = job.kill_rank(1)
    (r,) = job.wait(timeout=30).check([0])
    err = r["error"]
    assert err is not None, f"rank 0 relayed {r['iterations']} times and never saw rank 1 die"
    assert "PeerError" in err["mro"] or "CommAbortedError" in err["mro"], err
    assert _names_rank(err["msg"], 1), err["msg"]
    assert err["t"] - t_kill < 2.0, f"error came {err['t'] - t_kill:.2f} s after the kill"


def test_peer_that_never_joins_times_out_naming_it(launcher: Launcher, leak_check: LeakCheck) -> None:
    job = launcher("relay", 2, {"case": "timeout"}, transport="tcp", timeout=10.0, gates=["done"])
    job.wait_event(0, "timed_out", timeout=30)
    job.gate_open("done")
    r0, _ = job.wait(timeout=30).check()
    err = r0["error"]
    assert err is not None and "OpTimeoutError" in err["mro"], r0
    assert _names_rank(err["msg"], 1) and "relay" in err["msg"], err["msg"]
    assert 1.0 <= r0["seconds"] < 5.0, r0["seconds"]  # the relay's own timeout, not HETOBS_TIMEOUT


def test_dump_of_in_flight_relay_shows_where_data_stopped(launcher: Launcher, leak_check: LeakCheck,
                                                          fake_cuda: Path) -> None:
    """Rank 0 (stage cuda) has its device-to-host copies held by the stand-in: the dump shows its
    chunks posted but none copied in, none sent; rank 1 (stage host: islands differ) got nothing.
    Released, the relay completes bit-exact."""
    job = launcher("relay", 2, {"case": "stalled_copy"}, transport="shm", timeout=30.0,
                   env={"LD_LIBRARY_PATH": str(fake_cuda), "HETOBS_RELAY_SLOTS": "4"})
    r0, r1 = job.wait(timeout=60).check()
    rel = r0["relay"]
    assert rel is not None, r0
    assert r0["in_flight_op"] == "relay"
    assert rel["stage"] == "cuda" and rel["pipeline"] is True and rel["chunk_bytes"] == 65536 and rel["slots"] == 4
    (peer,) = rel["peers"]
    assert peer["peer"] == 1 and peer["send"]["chunks"] == 11, peer
    assert peer["send"]["copied_in"] == 0 and peer["send"]["sent"] == 0, peer
    assert r0["cuda"]["device_syncs"] == 0
    assert r1["exact"] and r1["phases"]["bytes_recv"] == 10 * 65536 + 5
    assert r0["phases"]["chunks"] == 11 and r0["phases"]["d2h_ns"] > 0


def test_bad_arguments_are_value_errors(launcher: Launcher, leak_check: LeakCheck) -> None:
    job = launcher("relay", 2, {"case": "bad_input"}, transport="shm")
    for r in job.wait(timeout=60).check():
        errs: list[Any] = r["errors"]
        assert len(errs) == 7, errs
        assert "stage='gpu'" in errs[0] and "chunk_bytes=0" in errs[1] and "slots=-1" in errs[2], errs
        assert "cannot relay to itself" in errs[3] and "(peer, buffer) pair" in errs[4], errs
        assert "relay sends[0]" in errs[5] and "stage='cuda'" in errs[6], errs


def test_bench_relay_cli_smoke(core: Any) -> None:
    """`hetobs bench relay` runs every variant and reports consistent rows (a smoke test: no timing
    is asserted)."""
    p = subprocess.run([sys.executable, "-m", "hetobs.cli", "bench", "relay", "--sizes", "64K,1M", "--reps", "1",
                        "--chunk", "256K", "--slots", "2", "--json"], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [r["size"] for r in rows] == [65536, 1 << 20], rows
    for r in rows:
        assert set(r["stages"]) == {"copy", "wire"}, r
        for k in ("pipelined", "unpipelined"):
            assert r[k] > 0 and r["cores"][k] > 0, r
        for k, bw in r["stages"].items():
            assert bw > 0 and r["cores"][k] > 0, r
        assert abs(r["ratio"] - r["pipelined"] / r["unpipelined"]) < 1e-9
        assert r["bottleneck"] == min(r["stages"], key=r["stages"].get)
        assert abs(r["efficiency"] - r["pipelined"] / r["stages"][r["bottleneck"]]) < 1e-9
    bad = subprocess.run([sys.executable, "-m", "hetobs.cli", "bench", "relay", "--chunk", "lots"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--chunk" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_relay_ops_are_counted_in_stats_and_prometheus(launcher: Launcher, leak_check: LeakCheck) -> None:
    """Host relays (the island ops' crossings) count their calls and bytes in the live stats (layout 3's
    relay slot): the stats reader and the Prometheus exporter show what the records say moved."""
    from prometheus_client.parser import text_string_to_metric_families

    job = launcher("relay", 2, {"case": "stats", "relays": 3}, transport="shm")
    for r in job.wait(timeout=60).check():
        assert r["records"] == 3 and r["record_bytes"] > 0, r
        assert r["stats"][str(r["comm_id"])] == [3, r["record_bytes"], 0], r["stats"]
        samples = {s.name: s for f in text_string_to_metric_families("\n".join(r["prometheus"]) + "\n")
                   for s in f.samples}
        calls, sent = samples["hetobs_collectives_total"], samples["hetobs_collective_bytes_total"]
        assert calls.value == 3.0 and sent.value == float(r["record_bytes"]), r["prometheus"]
        assert calls.labels["op"] == "relay" and calls.labels["comm"] == str(r["comm_id"]), calls.labels
