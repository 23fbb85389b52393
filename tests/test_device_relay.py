"""The relay's stage "device": any torch device, through torch's device-generic API
(hetobs._torch_ext's copy lane), proven on the stand-in accelerator of standin/.

The stand-in (hetobs_standin) is NOT a real device. It models what the relay depends on:
device memory that host code cannot read (non-host addresses), asynchronous host<->device
copies on copy engines ordered by streams and events, pinned host memory, and a settable
copy bandwidth paced by time. It does not model a vendor's driver, its speed, device
compute or a device-to-device network. Rank bodies: tests/device_relay_programs.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

try:  # not a skip: scripts/setup.sh builds it, so a missing stand-in is a broken set-up
    import hetobs_standin  # noqa: F401
except ImportError as e:
    raise ImportError(f"the stand-in device (hetobs_standin) does not load: run scripts/setup.sh ({e})") from None

if TYPE_CHECKING:
    from conftest import Launcher, LeakCheck


@pytest.mark.parametrize("world,transport", [(2, "shm"), (3, "tcp")])
def test_device_relay_is_bit_exact_and_leaves_the_callers_device_alone(launcher: Launcher, leak_check: LeakCheck,
                                                                        world: int, transport: str) -> None:
    """Every rank relays five messages (0 B, 1 B, odd sizes, many chunks) to and from every other
    rank from tensors on standin:1 while its current device is standin:0, pipelined and not,
    sync and async: every byte lands, the caller's current device and stream are unchanged,
    the records name the device, and the bytes went through the device's copy engines."""
    job = launcher("device_relay", world, {"case": "matrix", "chunk": 4096, "slots": 3}, transport=transport,
                   timeout=30.0, deadline=120.0)
    for r in job.wait(timeout=120).check():
        assert r["problems"] == [], f"rank {r['rank']}: {r['problems']}"
        assert r["records"] == 4 and r["devices"] == ["standin"], r
        # Four relays each way: at least the payload crossed each engine four times.
        assert r["engines"]["d2h"]["bytes"] >= 4 * 150_001 and r["engines"]["h2d"]["bytes"] >= 4 * 150_001, r


def test_device_relay_orders_after_the_callers_stream_without_a_host_wait(launcher: Launcher,
                                                                          leak_check: LeakCheck) -> None:
    """The caller queues a slow copy into its send tensor and relays at once: the relay's copies
    wait for it on the device (an event on the caller's stream blocks the relay's stream), so the
    peer gets the new bytes, and the caller's host never blocked on its stream."""
    job = launcher("device_relay", 2, {"case": "order", "gbps": 0.1}, transport="shm", timeout=30.0)
    r0, r1 = job.wait(timeout=60).check()
    assert r1["exact"], "the relay sent the bytes from before the caller's copy"
    assert r0["host_waits_on_caller_stream"] == 0, r0
    assert r0["queued_s"] < r0["copy_s"] / 2, r0  # the caller's copy itself was asynchronous


def test_device_relay_bad_arguments_are_value_errors(launcher: Launcher, leak_check: LeakCheck) -> None:
    job = launcher("device_relay", 2, {"case": "bad_input"}, transport="shm")
    for r in job.wait(timeout=60).check():
        cpu, mixed, strided, numpy_array, device_as_host = r["errors"]
        assert "CPU tensor needs no staging" in cpu, cpu
        assert "standin:1" in mixed and "one device per relay" in mixed, mixed
        assert "not contiguous" in strided, strided
        assert "takes torch tensors" in numpy_array, numpy_array
        assert device_as_host is not None and "standin" in device_as_host, device_as_host
