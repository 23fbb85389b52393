"""Faults: a peer killed mid-op, strangers at the door, mismatched collectives, timeouts.

Each error must come fast (well under HETOBS_TIMEOUT where the fault is detectable), be a
hetobs.HetobsError subclass, and name the rank at fault. Synchronisation with the ranks is
through their event pipes and gates (tests/_launch.py), never a sleep.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from _launch import run_python

if TYPE_CHECKING:
    from conftest import Launcher, LeakCheck

pytestmark = pytest.mark.slow


def _is(err: dict[str, Any] | None, *names: str) -> bool:
    return err is not None and any(n in err["mro"] for n in names)


def _names_rank(msg: str, rank: int) -> bool:
    return re.search(rf"\brank {rank}\b", msg) is not None


def _fmt(err: dict[str, Any] | None) -> str:
    return "no error" if err is None else f"{err['type']}: {err['msg']!r}"


# ---------------------------------------------------------------------------------------------
# (a) a peer SIGKILLed mid-loop
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transport,victim", [("tcp", 2), ("shm", 2), ("tcp", 0)])
def test_killed_peer_raises_naming_it(launcher: Launcher, leak_check: LeakCheck, transport: str,
                                      victim: int) -> None:
    """Rank `victim` is SIGKILLed mid-loop (rank 0 too: nothing after start-up depends on it)."""
    job = launcher("kill_loop", 4, {"n": 262144, "max_seconds": 30.0}, transport=transport, timeout=3.0,
                   deadline=60.0)
    job.wait_event(victim, "looping", timeout=40)
    t_kill = job.kill_rank(victim)
    res = job.wait(timeout=30)
    survivors = res.check([r for r in range(4) if r != victim])
    problems, design = [], []
    for r in survivors:
        err, who = r["error"], f"rank {r['rank']}"
        if err is None:
            problems.append(f"{who}: looped {r['iterations']} times and never saw rank {victim} die")
            continue
        if not _is(err, "PeerError", "CommAbortedError") or not _is(err, "HetobsError"):
            problems.append(f"{who}: expected PeerError or CommAbortedError, got {_fmt(err)}")
        if not _names_rank(err["msg"], victim):
            problems.append(f"{who}: message does not name rank {victim}: {err['msg']!r}")
        delay = err["t"] - t_kill
        if delay > 2.0:
            problems.append(f"{who}: error came {delay:.2f}s after the kill (limit 2s): {_fmt(err)}")
        if not _is(r["after"], "CommAbortedError"):
            problems.append(f"{who}: the op after the error: expected CommAbortedError, got {_fmt(r['after'])}")
        if r["close"] is not None or r["close_seconds"] > 5.0:
            problems.append(f"{who}: close() after the failure: {_fmt(r['close'])} in {r['close_seconds']:.2f}s")
        if "all_reduce" not in err["msg"]:
            design.append(f"{who}: DESIGN.md wants the op named in a dead-peer error: {err['msg']!r}")
    assert not problems, "\n".join(problems) + "\n" + res.describe()
    assert not design, "\n".join(design)


# ---------------------------------------------------------------------------------------------
# (b) strangers: wrong secret, wrong job, garbage bytes
# ---------------------------------------------------------------------------------------------
PROBE = (
    "import sys, time, hetobs, hetobs._core as core\n"
    "host, port, job, secret = {host!r}, {port!r}, {job!r}, {secret!r}\n"
    "t0 = time.monotonic()\n"
    "try:\n"
    "    try:\n"
    "        r = core.probe(host, port, job, secret)\n"
    "    except TypeError:  # a binding that wants the timeout too\n"
    "        r = core.probe(host, port, job, secret, 5.0)\n"
    "    emit({{'error': None, 'returned': repr(r), 'seconds': time.monotonic() - t0}})\n"
    "except Exception as e:\n"
    "    emit({{'error': type(e).__name__, 'mro': [c.__name__ for c in type(e).__mro__], 'msg': str(e),\n"
    "          'is_auth': isinstance(e, hetobs.AuthError), 'seconds': time.monotonic() - t0}})\n"
)


def _probe(tmp_path: Path, host: str, port: int, job: str, secret: str) -> dict[str, Any]:
    out = run_python(PROBE.format(host=host, port=port, job=job, secret=secret),
                     env={"HETOBS_SECRET": secret, "HETOBS_JOB_ID": job, "HETOBS_DIR": str(tmp_path / "stranger")},
                     timeout=20, workdir=tmp_path / "probe")
    assert out.result is not None, f"probe process crashed (rc={out.returncode}):\n{out.stderr}"
    return out.result


def _garbage(host: str, port: int, payload: bytes, wait_close: float) -> str:
    """Send `payload` and report what the listener did: 'closed', 'reset', or 'still open'."""
    with socket.create_connection((host, port), timeout=5) as s:
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            return "reset"
        s.settimeout(wait_close)
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return "closed"
        except ConnectionResetError:
            return "reset"
        except socket.timeout:
            return "still open"


def test_strangers_are_rejected_and_job_completes(launcher: Launcher, leak_check: LeakCheck,
                                                  tmp_path: Path) -> None:
    W = 3
    job = launcher("auth", W, {"rounds": 30}, transport="tcp", env={"HETOBS_SECRET": "s3cret"},
                   gates=[f"go-{r}" for r in range(W)], timeout=3.0, connect_timeout=3.0, deadline=120.0)
    evs = [job.wait_event(r, "address", timeout=40) for r in range(W)]
    addrs = [(str(e["address"][0]), int(e["address"][1])) for e in evs]
    problems = []
    if evs[0]["how"] != "Communicator.address":
        problems.append(f"API: Communicator has no `address`; used {evs[0]['how']}")
    idle = socket.create_connection(addrs[1], timeout=5)  # a silent connection held during the whole run
    try:
        host, port = addrs[0]
        wrong = _probe(tmp_path, host, port, job.job_id, "wrong")
        if not wrong["error"] or not wrong.get("is_auth"):
            problems.append(f"probe with a wrong secret: expected AuthError, got {wrong}")
        other_job = _probe(tmp_path, host, port, "some-other-job", "s3cret")
        if not other_job["error"] or not other_job.get("is_auth"):
            problems.append(f"probe with another job's id: expected AuthError, got {other_job}")
        right = _probe(tmp_path, host, port, job.job_id, "s3cret")
        if right["error"]:
            problems.append(f"probe with the right secret and job (control) failed: {right}")
        # garbage: random bytes, a huge length header, an HTTP request; each to a different rank
        rnd = os.urandom(4096)
        for i, payload in enumerate([rnd, b"\xff" * 64, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"]):
            what = _garbage(*addrs[i % W], payload, wait_close=6.0)
            if what == "still open":
                problems.append(f"rank {i % W} kept a connection open 6s after garbage {payload[:16]!r}")
        for r in range(W):
            job.gate_open(f"go-{r}")
        res = job.wait(timeout=90)
    finally:
        idle.close()
    results = res.check()
    for r in results:
        for name in ("before", "after"):
            sec = r["sections"][name]
            if sec["error"]:
                problems.append(f"rank {r['rank']} {name}: raised {sec['error']['type']}: {sec['error']['msg']}")
            problems += [f"rank {r['rank']} {name}: {f}" for f in sec["failures"]]
        if r["sections"]["after"]["checks"] < 60:
            problems.append(f"rank {r['rank']}: only {r['sections']['after']['checks']} checks after the strangers")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# (c) mismatched collectives
# ---------------------------------------------------------------------------------------------
DEVIATING = re.compile(r"deviating ranks? (\d+(?:\s*(?:,|and)\s*\d+)*)")


def _deviating(msg: str) -> set[int] | None:
    found = DEVIATING.findall(msg)
    if not found:
        return None
    return {int(x) for group in found for x in re.findall(r"\d+", group)}


@pytest.mark.parametrize("variant,world,transport,deviants", [
    ("op", 4, "tcp", {2}),          # rank 2 all_gather, the others all_reduce
    ("op", 4, "shm", {2}),
    ("count", 4, "tcp", {2}),       # rank 2 all_reduce of 1001 elements, the others 1000
    ("dtype", 4, "tcp", {2}),       # rank 2 int32, the others float32 (same bytes)
    ("redop", 4, "tcp", {2}),       # rank 2 max, the others sum
    ("root", 4, "tcp", {3}),        # broadcast: root 1 on rank 3, root 0 elsewhere
    ("count2", 5, "tcp", {1, 2}),   # ranks 1 and 2 differ, three agree
])
def test_mismatch_names_deviating_rank(launcher: Launcher, leak_check: LeakCheck, variant: str, world: int,
                                       transport: str, deviants: set[int]) -> None:
    job = launcher("mismatch", world, {"variant": variant}, transport=transport, timeout=3.0, deadline=60.0)
    res = job.wait(timeout=50)
    results = res.check()
    problems = []
    want = ("deviating rank " if len(deviants) == 1 else "deviating ranks ") + ", ".join(map(str, sorted(deviants)))
    n_mismatch = 0
    for r in results:
        err, who, late = r["error"], f"rank {r['rank']}", False
        if err is None:
            # This rank's part of the op never touched the deviator's data (a broadcast that
            # only sends toward it, say): it learns of the mismatch at its next op, which must
            # raise it with the same verdict. It may not go on as if nothing happened.
            err, late = r["after"], True
        if not _is(err, "MismatchError", "CommAbortedError"):
            problems.append(f"{who}: the mismatched call: expected MismatchError (or CommAbortedError), got "
                            f"{_fmt(err)}; the next op raised {_fmt(r['after'])}")
            continue
        n_mismatch += _is(err, "MismatchError")
        named = _deviating(err["msg"])
        if named != deviants or want not in err["msg"]:
            problems.append(f"{who}: message should contain {want!r} and name no other deviating rank: "
                            f"{err['msg']!r}")
        if late:
            continue
        if r["seconds"] > 2.0:
            problems.append(f"{who}: took {r['seconds']:.2f}s to see the mismatch")
        if not _is(r["after"], "CommAbortedError"):
            problems.append(f"{who}: op after the mismatch: expected CommAbortedError, got {_fmt(r['after'])}")
    if not n_mismatch and not problems:
        problems.append("no rank raised MismatchError (only cascades)")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# (d) timeouts
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["per_op", "env"])
def test_timeout_names_missing_rank(launcher: Launcher, leak_check: LeakCheck, mode: str) -> None:
    """Rank 1 never calls the op; rank 0's all_reduce (timeout=1.0 per op, or HETOBS_TIMEOUT=1)
    raises OpTimeoutError naming rank 1 after about a second."""
    job = launcher("timeout", 2, {"per_op": 1.0 if mode == "per_op" else None}, transport="tcp",
                   timeout=3.0 if mode == "per_op" else 1.0, gates=["release-1"], deadline=60.0)
    job.wait_event(0, "raised", timeout=30)
    job.gate_open("release-1")
    res = job.wait(timeout=30)
    r0, r1 = res.check()
    err = r0["error"]
    assert _is(err, "OpTimeoutError") and _is(err, "HetobsError"), f"expected OpTimeoutError, got {_fmt(err)}"
    assert _names_rank(err["msg"], 1), f"timeout message does not name rank 1: {err['msg']!r}"
    assert 0.9 <= r0["seconds"] <= 2.0, f"timed out after {r0['seconds']:.2f}s, wanted ~1s"
    assert _is(r0["after"], "CommAbortedError"), f"op after the timeout: {_fmt(r0['after'])}"
    assert r1["close"] is None and r1["close_seconds"] < 5.0, f"rank 1 close(): {_fmt(r1['close'])}"


def test_async_timeout_raises_from_wait(launcher: Launcher, leak_check: LeakCheck) -> None:
    job = launcher("async_timeout", 2, {}, transport="shm", timeout=3.0, gates=["release-1"], deadline=60.0)
    job.wait_event(0, "raised", timeout=30)
    job.gate_open("release-1")
    r0, _ = job.wait(timeout=30).check()
    err = r0["error"]
    assert _is(err, "OpTimeoutError"), f"Work.wait() should re-raise OpTimeoutError, got {_fmt(err)}"
    assert _names_rank(err["msg"], 1), err["msg"]
    assert r0["issued_seconds"] < 0.5, f"async all_reduce blocked {r0['issued_seconds']:.2f}s before returning"
    assert 0.9 <= r0["seconds"] <= 2.0, r0["seconds"]


def test_missing_rank_at_startup(launcher: Launcher, leak_check: LeakCheck) -> None:
    """Rank 2 never starts hetobs: the others' init() fails within the connect timeout naming it."""
    job = launcher("init_only", 3, {"skip": [2]}, transport="tcp", connect_timeout=2.0, deadline=60.0)
    res = job.wait(timeout=40)
    results = res.check()
    for r in results[:2]:
        err = r["error"]
        assert _is(err, "HetobsError"), f"rank {r['rank']}: init() without rank 2: {_fmt(err)}"
        assert _names_rank(err["msg"], 2), f"rank {r['rank']}: {err['msg']!r}"
        assert r["seconds"] < 2.0 + 2.0, f"rank {r['rank']}: init() took {r['seconds']:.2f}s (connect timeout 2s)"
