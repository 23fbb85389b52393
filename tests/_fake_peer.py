"""A hetobs peer written in Python, for feeding hostile frames to a real rank.

It speaks the authenticated handshake (csrc/src/bootstrap/handshake.cc) with the job's key
(HETOBS_SECRET), joins rank 0's rendezvous as rank 1 of a world of 2, and opens the data
connection to rank 0 (comm 0). After that the test writes whatever bytes it likes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import time

HELLO_MAGIC = 0x48425448
FRAME_MAGIC = 0x31425448
VERSION = 1
PURPOSE_RENDEZVOUS, PURPOSE_TRANSPORT = 1, 2
KIND_DATA, KIND_ACK, KIND_ABORT, KIND_CLOSE = 1, 2, 3, 4
OP_ALL_REDUCE, DT_FLOAT32, RED_SUM = 0, 6, 0

FRAME = struct.Struct("<IBBBBIiQQQQ16x")  # FrameHeader, 64 bytes


def frame(*, kind: int = KIND_DATA, op: int = OP_ALL_REDUCE, dtype: int = DT_FLOAT32, redop: int = RED_SUM,
          comm_tag: int = 0, root: int = 0, seq: int = 1, count: int = 0, chunk: int = 0, nbytes: int = 0,
          magic: int = FRAME_MAGIC) -> bytes:
    return FRAME.pack(magic, kind, op, dtype, redop, comm_tag, root, seq, count, chunk, nbytes)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = s.recv(n - len(buf))
        if not part:
            raise ConnectionError(f"peer closed after {len(buf)} of {n} bytes")
        buf += part
    return buf


def _blob_read(s: socket.socket) -> bytes:
    (n,) = struct.unpack("<I", _recv_exact(s, 4))
    return _recv_exact(s, n)


def _blob_write(s: socket.socket, data: bytes) -> None:
    s.sendall(struct.pack("<I", len(data)) + data)


def client_handshake(s: socket.socket, job: str, key: str, purpose: int, from_rank: int, to_rank: int,
                     comm_id: int = 0) -> None:
    magic, version, snonce = struct.unpack("<II16s", _recv_exact(s, 24))
    assert magic == HELLO_MAGIC and version == VERSION, "not a hetobs listener"
    cnonce = os.urandom(16)
    msg = (b"hetobs-client|" + job.encode() + b"|" + snonce + cnonce +
           struct.pack("<IiiQ", purpose, from_rank, to_rank, comm_id))
    mac = hmac.new(key.encode(), msg, hashlib.sha256).digest()
    s.sendall(struct.pack("<IIIiiIQ16s32s", HELLO_MAGIC, VERSION, purpose, from_rank, to_rank, 0, comm_id,
                          cnonce, mac))
    magic, status, smac = struct.unpack("<II32s", _recv_exact(s, 40))
    assert magic == HELLO_MAGIC and status == 0, "the rank refused our handshake"
    want = hmac.new(key.encode(), b"hetobs-server|" + job.encode() + b"|" + cnonce + snonce, hashlib.sha256).digest()
    assert hmac.compare_digest(want, smac), "the rank could not prove it knows the key"


def _connect(addr: tuple[str, int], deadline: float) -> socket.socket:
    while True:
        try:
            s = socket.create_connection(addr, timeout=max(deadline - time.monotonic(), 0.1))
            s.settimeout(max(deadline - time.monotonic(), 0.1))
            return s
        except ConnectionRefusedError:  # rank 0 is not listening yet: it is still importing
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def join_as_rank1(master: tuple[str, int], job: str, key: str, timeout: float = 20.0) -> socket.socket:
    """Rendezvous as rank 1 of 2 and return the authenticated data connection to rank 0."""
    deadline = time.monotonic() + timeout
    with _connect(master, deadline) as r:
        client_handshake(r, job, key, PURPOSE_RENDEZVOUS, 1, 0)
        _blob_read(r)  # the job id
        card = f"hetobs-card-v1\n1\n{os.getpid()}\nfake-peer-host:0\nfake-peer\n127.0.0.1\n9\n"
        _blob_write(r, card.encode())
        table = _blob_read(r)
    cards, pos = [], 0
    while pos + 4 <= len(table):
        (n,) = struct.unpack_from("<I", table, pos)
        cards.append(table[pos + 4:pos + 4 + n].decode())
        pos += 4 + n
    lines = cards[0].split("\n")
    s = _connect((lines[5], int(lines[6])), deadline)
    client_handshake(s, job, key, PURPOSE_TRANSPORT, 1, 0, comm_id=0)
    return s
