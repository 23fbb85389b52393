"""What `hetobs top` shows: per-rank and per-link rates over the window between two snapshots.

Counters in the stats segment are cumulative; a live view wants "now". The window
is the difference between two snapshots of the same source: busbw and algbw of the
ops finished in it (bytes over time spent in those ops, busbw weighted by each op
kind's nccl-tests factor), and per-link throughput (bytes over wall time) next to
network bandwidth (bytes over the link's busy time). Plain dicts, so the CLI can
print them as JSON unchanged.
"""

from __future__ import annotations

from typing import Any

from hetobs import stats
from hetobs.plan.accounting import busy_share

from .metrics import busbw_factor, rank_state, seconds_since_progress
from .source import RankEntry, Snapshot
from .waits import mark_waits, waiting_on

__all__ = ["view"]


def _current(st: stats.RankStats, now: int) -> list[dict[str, Any]]:
    out = []
    for c in st.comms:
        if c.inflight_record is None:
            continue
        p2p = c.inflight_op in ("send", "recv")
        out.append({"comm": c.comm_id, "op": c.inflight_op, "seq": c.p2p_seq if p2p else c.coll_seq,
                    "p2p": p2p, "seconds": max(0.0, (now - (c.inflight_start_ns or now)) / 1e9)})
    return out


def _ops_delta(st: stats.RankStats, old: stats.RankStats | None) -> tuple[int, int, float, int]:
    """(ops, bytes, bytes x busbw factor, ns in ops) finished since `old`."""
    before: dict[tuple[int, str], stats.OpKindStats] = {}
    if old is not None and old.pid == st.pid:
        before = {(c.comm_id, op): k for c in old.comms for op, k in c.ops.items()}
    calls = nbytes = ns = 0
    weighted = 0.0
    for c in st.comms:
        for op, k in c.ops.items():
            b = before.get((c.comm_id, op))
            dc, db, dn = k.calls - (b.calls if b else 0), k.bytes - (b.bytes if b else 0), k.total_ns - (
                b.total_ns if b else 0)
            if dc <= 0:
                continue
            calls, nbytes, ns = calls + dc, nbytes + db, ns + dn
            weighted += db * busbw_factor(op, c.size)
    return calls, nbytes, weighted, ns


def _arrivals(st: stats.RankStats | None) -> dict[int, tuple[int, int]]:
    """{comm: (ops this rank entered last, ops judged)} (record/arrival.h)."""
    if st is None:
        return {}
    return {c.comm_id: (c.arrivals.last, c.arrivals.judged) for c in st.comms if c.arrivals is not None}


def _last_share(st: stats.RankStats, old: stats.RankStats | None) -> tuple[int, float | None]:
    """(collectives this rank entered last so far, its share of the judged ones since `old`).

    Each op is counted as a last arrival on one rank only, so on a healthy n-rank job every
    rank's share is near 1/n and a straggler's near 1. Without a window: the lifetime share.
    """
    now = _arrivals(st)
    before = _arrivals(old) if old is not None and old.pid == st.pid else {}
    last = sum(v[0] for v in now.values())
    dl = sum(v[0] - before.get(k, (0, 0))[0] for k, v in now.items())
    dj = sum(v[1] - before.get(k, (0, 0))[1] for k, v in now.items())
    return last, (dl / dj if dj > 0 else None)


def _rank_row(e: RankEntry, old: RankEntry | None, now: int, window_s: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"rank": e.rank, "host": e.host, "up": e.live, "problem": e.problem,
                           "detail": e.detail or None}
    st = e.stats
    if st is None:
        row["state"] = "exited" if e.exited_cleanly else "unknown"
        return row
    row.update(pid=st.pid, process=st.process, island=st.island or None,
               island_device=st.island_device or None, island_library=st.island_library or None,
               state=rank_state(st, now),
               current=_current(st, now),
               seconds_since_progress=seconds_since_progress(st, now),
               heartbeat_age_s=max(0.0, (now - st.heartbeat_ns) / 1e9), hang_timeout_s=st.hang_timeout_s,
               hangs_detected=st.hangs_detected, hangs_suspected=st.hangs_suspected,
               hangs_resolved=st.hangs_resolved, dumps_written=st.dumps_written,
               last_seq={str(c.comm_id): c.coll_seq for c in st.comms},
               busy_share=busy_share(st.records, st.world_size) if st.records else None)
    last, share = _last_share(st, old.stats if old is not None and window_s is not None else None)
    row.update(last_arrivals=last, last_share=share)
    if window_s is None:
        row.update(window_ops=None, window_bytes=None, busbw_gbps=None, algbw_gbps=None)
        return row
    calls, nbytes, weighted, ns = _ops_delta(st, old.stats if old else None)
    row.update(window_ops=calls, window_bytes=nbytes,
               busbw_gbps=weighted / ns if ns > 0 else None, algbw_gbps=nbytes / ns if ns > 0 else None)
    return row


def _link_rows(e: RankEntry, old: RankEntry | None, window_s: float | None) -> list[dict[str, Any]]:
    st = e.stats
    if st is None:
        return []
    before = {}
    if old is not None and old.stats is not None and old.stats.pid == st.pid:
        before = {(ln.comm_id, ln.peer): ln for ln in old.stats.links}
    rows = []
    for ln in st.links:
        row: dict[str, Any] = {"rank": e.rank, "comm": ln.comm_id, "peer": ln.global_peer, "transport": ln.transport,
                               "bytes_sent": ln.bytes_sent, "bytes_recv": ln.bytes_recv}
        b = before.get((ln.comm_id, ln.peer))
        if window_s and b is not None:
            ds, dr, dbusy = ln.bytes_sent - b.bytes_sent, ln.bytes_recv - b.bytes_recv, ln.busy_ns - b.busy_ns
            row.update(send_mbps=ds / window_s / 1e6, recv_mbps=dr / window_s / 1e6,
                       busy_fraction=min(1.0, max(0.0, dbusy / 1e9 / window_s)),
                       network_gbps=(ds + dr) / dbusy if dbusy > 0 else None)
        else:
            row.update(send_mbps=None, recv_mbps=None, busy_fraction=None,
                       network_gbps=(ln.bytes_sent + ln.bytes_recv) / ln.busy_ns if ln.busy_ns > 0 else None)
        t = ln.tcp
        row.update(rtt_ms=t["rtt_us"] / 1e3 if t else None, retransmits=t["retransmits_total"] if t else None)
        rows.append(row)
    return rows


def view(cur: Snapshot, prev: Snapshot | None = None) -> dict[str, Any]:
    """The ranks and links of `cur`, with window rates against `prev` (None: no window)."""
    window_s = (cur.time_ns - prev.time_ns) / 1e9 if prev is not None and cur.time_ns > prev.time_ns else None
    old = {e.rank: e for e in prev.ranks} if prev is not None else {}
    ranks = [_rank_row(e, old.get(e.rank), cur.time_ns, window_s) for e in cur.ranks]
    mark_waits(ranks, {e.rank: waiting_on(e.stats) for e in cur.ranks if e.stats is not None and e.live})
    return {
        "job": cur.job, "time_ns": cur.time_ns, "window_s": window_s, "ranks": ranks,
        "links": [row for e in cur.ranks for row in _link_rows(e, old.get(e.rank), window_s)],
    }
