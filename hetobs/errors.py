"""Exceptions raised by hetobs collectives.

The native core raises these same classes (registered by the extension), so
`except hetobs.PeerError` works for errors born in C++.
"""

from __future__ import annotations

__all__ = ["HetobsError", "PeerError", "MismatchError", "OpTimeoutError", "CommAbortedError", "AuthError",
           "DataMismatchError"]


class HetobsError(RuntimeError):
    """Base class of every error a communicator raises."""


class PeerError(HetobsError):
    """A peer died, closed its connection or reported a transport failure mid-op."""


class MismatchError(HetobsError):
    """Ranks called different collectives (op, dtype, count or root) at one sequence id."""


class OpTimeoutError(HetobsError):
    """An op waited longer than its timeout on a peer; the message names the peer."""


class CommAbortedError(HetobsError):
    """The communicator failed earlier and refuses further ops; the message carries the root cause."""


class AuthError(HetobsError):
    """A handshake failed authentication (wrong secret or another job)."""


class DataMismatchError(HetobsError):
    """A collective's result differs between ranks (HETOBS_DIGEST): silent data corruption.

    Raised on every rank, after the op finished and the dump was written. Fields, so nobody
    parses the message: `ranks` (world ranks whose result differs from the majority's; every
    rank when there is no majority), `op`, `comm`, `seq`, `element` (the first differing
    element, or None).
    """

    ranks: list[int]
    op: str
    comm: int
    seq: int
    element: int | None
