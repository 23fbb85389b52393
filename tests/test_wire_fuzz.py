"""Hostile frames after an authenticated handshake (issue 13, item 2).

A Python peer (tests/_fake_peer.py) joins a real rank 0 as rank 1 with the job's secret and,
while rank 0 runs a large all_reduce, sends one malformed frame: lengths past the receive
buffer, "negative" lengths, empty frames, frame numbers out of order, misaligned reduction
payloads, acks of frames never sent, truncated headers, random bytes. Rank 0 must fail the op
with a clear error naming the peer and exit normally: never a crash, never a hang, never a
"success" built from bytes it should have refused.
"""

from __future__ import annotations

import random
import socket

import pytest

from _fake_peer import KIND_ACK, KIND_CLOSE, frame, join_as_rank1

pytestmark = pytest.mark.slow

SECRET = "wire-fuzz-secret"
N = 1 << 20               # float32 elements: a ring all_reduce, 2 MiB per received piece
PIECE = N // 2 * 4        # bytes rank 0 expects from rank 1 in the first step
FRAME_MAX = 512 * 1024    # kTcpFrameBytes: the receiver's staging buffer


def _data(**kw) -> bytes:
    return frame(count=N, **kw)


# case -> (bytes rank 1 sends, what rank 0's error must say)
CASES = {
    # a frame longer than the staging buffer, though within the step: the heap overrun
    "past_staging_buffer": (_data(nbytes=PIECE) + bytes(PIECE), "protocol error"),
    # a length no sender makes (past the staging buffer too), not a peer running another op
    "negative_length": (_data(nbytes=(1 << 64) - 1), "protocol error"),
    "empty_frame": (_data(nbytes=0) + _data(chunk=1, nbytes=0), "protocol error"),
    "chunk_out_of_order": (_data(chunk=7, nbytes=4096) + bytes(4096), "protocol error"),
    "misaligned_payload": (_data(nbytes=4098) + bytes(4098), "protocol error"),
    "ack_of_unsent_frames": (frame(kind=KIND_ACK, chunk=1 << 40), "protocol error"),
    "unknown_kind": (_data(kind=9, nbytes=64) + bytes(64), "protocol error"),
    # a header cut short, then the end of the stream: a broken connection, not a deliberate
    # close (that is a close frame of its own); re-making it finds nobody at the peer's listener
    "truncated_header": (_data(nbytes=4096)[:37], "is gone"),
    # the deliberate close, said explicitly in the middle of the op
    "close_frame": (frame(kind=KIND_CLOSE), "closed its connection"),
    "random_bytes": (random.Random(13).randbytes(64 * 5), "protocol error"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_frame_fails_the_op_cleanly(launcher, case: str) -> None:
    # No watchdog: its error dump would ask the fake rank's side channel (nobody there) for a
    # second per case; the receive path under test is the same. No start barrier: the
    # launcher's rank 1 is a stand-in that exits at once.
    job = launcher("fuzz_target", 2, {"n": N}, timeout=20.0, connect_timeout=20.0, deadline=60.0,
                   env={"HETOBS_SECRET": SECRET, "HETOBS_WATCHDOG": "0"},
                   rank_env={1: {"HETOBS_TEST_FAKE_PEER": "1"}}, start_barrier=False)
    s = join_as_rank1(("127.0.0.1", job.master_port), job.job_id, SECRET)
    try:
        try:
            s.sendall(CASES[case][0])
        except OSError:
            pass  # rank 0 may cut the link before it has read everything
        if case in ("truncated_header", "random_bytes"):
            s.shutdown(socket.SHUT_WR)  # and nothing more: the header stays cut short
        res = job.wait()
    finally:
        s.close()
    r0 = res.ranks[0]
    assert r0.returncode == 0, f"rank 0 crashed or failed to report:\n{res.describe()}"
    errors = r0.result["errors"]
    assert errors and errors[-1] is not None, f"rank 0 accepted a hostile frame as data: {r0.result}"
    msg = errors[-1]["message"]
    # At once and for what it is: not the op's timeout, which a rank still waiting for more reaches.
    assert CASES[case][1] in msg and "rank 1" in msg, errors[-1]
    assert "Timeout" not in errors[-1]["type"], errors[-1]
