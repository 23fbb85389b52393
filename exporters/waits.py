"""Who waits on whom in a live job: the edges `hetobs top` shows, and the rank they point at.

A rank whose op is in flight waits on a peer when a message to or from that peer is
still open on the op's communicator (posted > done, per direction: the watchdog's rule
in Communicator::inFlight). Read from each rank's own stats segment, so it needs no
cooperation from the rank waited on: a rank asleep in Python, stopped, or busy
elsewhere shows up as the end of the others' waits. Such a rank — waited on by a stuck
(or suspect) rank and not itself waiting on anyone — is the one holding the job up:
its state becomes "blocking", whatever its own (healthy-looking) numbers say.
"""

from __future__ import annotations

from typing import Any

from hetobs import stats

__all__ = ["waiting_on", "mark_waits", "WAITING_STATES"]

# States of a waiter that make the rank it waits on "blocking" (a wait of a healthy op is
# just traffic in progress).
WAITING_STATES = ("stuck", "suspect")


def waiting_on(st: stats.RankStats) -> list[int]:
    """Global ranks the in-flight ops of `st` wait on, sorted."""
    inflight = {c.comm_id for c in st.comms if c.inflight_record is not None}
    peers = set()
    for ln in st.links:
        if ln.comm_id not in inflight:
            continue
        p = ln.progress
        if p.get("recv_posted", 0) > p.get("recv_done", 0) or p.get("send_posted", 0) > p.get("send_done", 0):
            peers.add(ln.global_peer)
    return sorted(peers)


def mark_waits(rows: list[dict[str, Any]], waits: dict[int, list[int]]) -> None:
    """Add `waiting_on` and `waited_on_by` to each rank row; the rank the stuck ones wait on
    and that waits on nobody gets state "blocking" (kept: "dead", "stopped", "exited",
    "unknown", which say more)."""
    by_rank = {r["rank"]: r for r in rows}
    waited_by: dict[int, list[int]] = {}
    for rank, peers in waits.items():
        if by_rank.get(rank, {}).get("state") not in WAITING_STATES:
            continue
        for peer in peers:
            waited_by.setdefault(peer, []).append(rank)
    for r in rows:
        r["waiting_on"] = waits.get(r["rank"], [])
        r["waited_on_by"] = sorted(waited_by.get(r["rank"], []))
        if r["waited_on_by"] and not r["waiting_on"] and r.get("state") in ("healthy", "suspect"):
            r["state"] = "blocking"
