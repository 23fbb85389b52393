"""Rank-side programs of tests/test_relay.py (run through rank_programs.py's "relay" entry).

Every message's bytes are a function of (sender, receiver, index), so each rank knows
what it must receive. Device buffers for stage "cuda" come from the stand-in CUDA runtime
(tests/nccl/fake_cudart.c, loaded as libcudart.so.12 through LD_LIBRARY_PATH): this machine
has no GPU, so "device memory" is host memory the stand-in hands out, and its
cudaMemcpyAsync is a memcpy; what the test checks is the relay's CUDA discipline.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from typing import Any

import numpy as np

STAGES = ("none", "host", "cuda")


def payload(src: int, dst: int, k: int, n: int) -> np.ndarray:
    return np.random.default_rng([src, dst, k, n]).integers(0, 256, n, dtype=np.uint8)


def sizes_for(src: int, dst: int) -> list[int]:
    """Messages src -> dst: empty, 1 byte, odd sizes, one spanning many chunks; asymmetric."""
    return [0, 1, 7 + 13 * src + 5 * dst, 4096 * (dst + 1) + 3, 150_001 + 4_099 * src]


class FakeDevice:
    """Device buffers from the stand-in runtime (cudaMalloc is malloc there)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcudart.so.12")
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        for name in ("fake_cuda_memcpy_async", "fake_cuda_memcpy_async_blocking", "fake_cuda_host_allocs",
                     "fake_cuda_device_syncs", "fake_cuda_stream_syncs", "fake_cuda_stream_waits"):
            getattr(self.lib, name).restype = ctypes.c_long
        self.keep: list[Any] = []
        s = ctypes.c_void_p()
        assert self.lib.cudaStreamCreate(ctypes.byref(s)) == 0
        self.stream = int(s.value or 0)  # "the application's stream", which produced the sources

    def alloc(self, data: np.ndarray | int) -> tuple[int, int]:
        n = data if isinstance(data, int) else data.size
        p = ctypes.c_void_p()
        assert self.lib.cudaMalloc(ctypes.byref(p), max(n, 1)) == 0
        if not isinstance(data, int) and n:
            ctypes.memmove(p.value, data.ctypes.data, n)
        return int(p.value or 0), n

    @staticmethod
    def read(buf: tuple[int, int]) -> np.ndarray:
        return np.frombuffer(ctypes.string_at(buf[0], buf[1]), np.uint8) if buf[1] else np.zeros(0, np.uint8)

    def counters(self) -> dict[str, int]:
        return {k: int(getattr(self.lib, "fake_cuda_" + k)()) for k in
                ("memcpy_async", "memcpy_async_blocking", "host_allocs", "device_syncs", "stream_syncs",
                 "stream_waits")}


def _one_relay(comm: Any, stage: str, pipeline: bool, chunk: int, slots: int, dev: FakeDevice | None,
               async_op: bool) -> list[str]:
    """Every rank relays with every other rank; returns what went wrong (empty: bit-exact)."""
    me, n = comm.rank, comm.size
    sends, recvs, expect = [], [], []
    for p in range(n):
        if p == me:
            continue
        for k, size in enumerate(sizes_for(me, p)):
            data = payload(me, p, k, size)
            sends.append((p, dev.alloc(data) if stage == "cuda" else data))
        for k, size in enumerate(sizes_for(p, me)):
            out = dev.alloc(size) if stage == "cuda" else np.full(size, 0xA5, np.uint8)
            recvs.append((p, out))
            expect.append((p, k, payload(p, me, k, size)))
    extra = {"cuda_stream": dev.stream} if stage == "cuda" and dev is not None else {}
    res = comm.relay(sends, recvs, stage=stage, pipeline=pipeline, chunk_bytes=chunk, slots=slots,
                     async_op=async_op, **extra)
    phases = res.result() if async_op else res
    label = f"stage={stage} pipeline={pipeline} async={async_op}"
    bad = []
    for (p, out), (_, k, want) in zip(recvs, expect):
        got = dev.read(out) if stage == "cuda" else out
        if not np.array_equal(got, want):
            bad.append(f"{label}: message {k} from rank {p} ({want.size} bytes) differs")
    sent = sum(size for p in range(n) if p != me for size in sizes_for(me, p))
    got_b = sum(size for p in range(n) if p != me for size in sizes_for(p, me))
    chunks = sum(max(1, -(-s // chunk)) for p in range(n) if p != me for s in sizes_for(me, p) + sizes_for(p, me))
    want_ph = {"bytes_sent": sent, "bytes_recv": got_b, "chunks": chunks}
    for key, v in want_ph.items():
        if phases[key] != v:
            bad.append(f"{label}: phases[{key!r}] = {phases[key]}, expected {v}")
    if (phases["d2h_ns"] > 0) != (stage != "none") or (phases["h2d_ns"] > 0) != (stage != "none"):
        bad.append(f"{label}: copy phases {phases['d2h_ns']}/{phases['h2d_ns']} ns for stage {stage}")
    if not 0 < phases["wire_ns"] <= phases["wall_ns"]:
        bad.append(f"{label}: wire_ns {phases['wire_ns']} outside (0, wall_ns {phases['wall_ns']}]")
    return bad


def prog_matrix(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    comm = ctx.init()
    dev = FakeDevice() if "cuda" in args["stages"] else None
    problems: list[str] = []
    runs = 0
    for stage in args["stages"]:
        for pipeline in (True, False):
            for async_op in ((False, True) if stage == "host" else (False,)):
                problems += _one_relay(comm, stage, pipeline, int(args["chunk"]), int(args["slots"]), dev,
                                       async_op)
                runs += 1
    recs = [r for r in comm.records() if r["op"] == "relay"]
    res = {"rank": comm.rank, "problems": problems, "runs": runs, "relay_records": len(recs),
           "p2p_seqs": [r.get("p2p_seq_id") for r in recs], "states": sorted({str(r.get("state")) for r in recs}),
           "cuda": dev.counters() if dev else None}
    comm.close()
    return res


def prog_env_chunks(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Defaults from HETOBS_RELAY_CHUNK_BYTES / HETOBS_RELAY_SLOTS (no chunk/slot arguments)."""
    comm = ctx.init()
    peer = 1 - comm.rank
    n = int(args["n"])
    src, dst = payload(comm.rank, peer, 0, n), np.zeros(n, np.uint8)
    ph = comm.relay([(peer, src)], [(peer, dst)], stage="host")
    ok = bool(np.array_equal(dst, payload(peer, comm.rank, 0, n)))
    comm.close()
    return {"rank": comm.rank, "phases": ph, "exact": ok}


def prog_mismatch(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    comm = ctx.init()
    peer = 1 - comm.rank
    n = 100 + comm.rank  # rank 0 sends 100 bytes, rank 1 sends 101; each expects its own size back
    out: dict[str, Any] = {"rank": comm.rank, "error": None}
    try:
        comm.relay([(peer, np.zeros(n, np.uint8))], [(peer, np.zeros(n, np.uint8))], stage=args["stage"])
    except Exception as e:
        out["error"] = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}
    comm.close()
    return out


def prog_kill(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Relay 8 MiB each way in a loop until an error; 'looping' after 2 relays (the test kills the peer)."""
    comm = ctx.init()
    peer = 1 - comm.rank
    n = 8 << 20
    src, dst = np.ones(n, np.uint8), np.zeros(n, np.uint8)
    res: dict[str, Any] = {"rank": comm.rank, "error": None, "iterations": 0}
    t_end = time.monotonic() + float(args.get("max_seconds", 30))
    try:
        while time.monotonic() < t_end:
            comm.relay([(peer, src)], [(peer, dst)], stage=args["stage"], chunk_bytes=1 << 20, slots=4)
            res["iterations"] += 1
            if res["iterations"] == 2:
                ctx.event("looping")
    except Exception as e:
        res["error"] = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e),
                        "t": time.monotonic()}
    comm.close()
    return res


def prog_stalled_copy(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 relays from "device" memory whose copies the stand-in holds (events not ready), rank 1
    receives into host memory: a dump taken meanwhile must show rank 0's chunks stuck before the wire."""
    from hetobs import _core

    comm = ctx.init()
    peer = 1 - comm.rank
    n, chunk = 10 * 65536 + 5, 65536
    res: dict[str, Any] = {"rank": comm.rank}
    if comm.rank == 0:
        dev = FakeDevice()
        src = dev.alloc(payload(0, 1, 0, n))
        dev.lib.fake_cuda_stall(1)
        work = comm.relay([(peer, src)], [], stage="cuda", chunk_bytes=chunk, async_op=True)
        relay_state = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until the relay is past its header and has posted its copies
            path = _core.dump_now("on_demand", "relay test", False)
            with open(path) as f:
                d = json.load(f)
            fl = next(c for c in d["comms"] if c["comm_id"] == comm.id)["in_flight"]
            relay_state = fl and fl.get("relay")
            if relay_state and relay_state["peers"] and relay_state["peers"][0]["send"]["chunks"]:
                res["in_flight_op"] = fl["op"]
                break
        res["relay"] = relay_state
        dev.lib.fake_cuda_stall(0)
        res["phases"] = work.result()
        res["cuda"] = dev.counters()
    else:
        dst = np.zeros(n, np.uint8)
        res["phases"] = comm.relay([], [(peer, dst)], stage="host", chunk_bytes=chunk)
        res["exact"] = bool(np.array_equal(dst, payload(0, 1, 0, n)))
    comm.close()
    return res


def prog_bad_input(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    comm = ctx.init()
    peer = 1 - comm.rank
    errors = []
    for kw in ({"stage": "gpu"}, {"chunk_bytes": 0}, {"slots": -1}):
        try:
            comm.relay([(peer, np.zeros(4, np.uint8))], [], **kw)
        except ValueError as e:
            errors.append(str(e))
    for sends in ([(comm.rank, np.zeros(4, np.uint8))], [(peer,)], [(peer, [1, 2])]):
        try:
            comm.relay(sends, [])
        except ValueError as e:
            errors.append(str(e))
    try:
        comm.relay([(peer, np.zeros(4, np.uint8))], [], stage="cuda")
    except ValueError as e:
        errors.append(str(e))
    comm.barrier()
    comm.close()
    return {"rank": comm.rank, "errors": errors}


def prog_timeout(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 relays with rank 1, which never calls relay (it waits at gate "done")."""
    comm = ctx.init()
    res: dict[str, Any] = {"rank": comm.rank, "error": None}
    if comm.rank == 0:
        t0 = time.monotonic()
        try:
            comm.relay([(1, np.ones(1 << 20, np.uint8))], [(1, np.zeros(1 << 20, np.uint8))], stage="host",
                       timeout=1.0)
        except Exception as e:
            res["error"] = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}
        res["seconds"] = time.monotonic() - t0
        ctx.event("timed_out")
    else:
        ctx.gate_wait("done")
    comm.close()
    return res


def prog_stats(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A few relays, then this rank's live stats as the stats reader and the Prometheus exporter see them."""
    from prometheus_client import CollectorRegistry, generate_latest

    from hetobs import stats
    from hetobs.exporters.prometheus import HetobsCollector
    from hetobs.exporters.source import InProcessSource

    comm = ctx.init()
    peer = 1 - comm.rank
    for k in range(int(args["relays"])):
        n = 1000 * (k + 1) + comm.rank
        src, dst = payload(comm.rank, peer, k, n), np.zeros(1000 * (k + 1) + peer, np.uint8)
        comm.relay([(peer, src)], [(peer, dst)], stage="host")
    recs = [r for r in comm.records() if r["op"] == "relay"]
    [seg] = [p for p in stats.segment_paths(ctx.job_id) if p.endswith(f"-r{comm.rank}")]
    relay = {c.comm_id: c.ops.get("relay") for c in stats.read_segment(seg).comms}
    reg = CollectorRegistry()
    reg.register(HetobsCollector(InProcessSource(ctx.job_id)))
    text = generate_latest(reg).decode()
    res = {"rank": comm.rank, "record_bytes": sum(int(r["bytes"]) for r in recs), "records": len(recs),
           "comm_id": int(recs[0]["comm_id"]) if recs else None,
           "stats": {str(c): (k.calls, k.bytes, k.errors) if k else None for c, k in relay.items()},
           "prometheus": [ln for ln in text.splitlines() if 'op="relay"' in ln and ln.startswith(
               ("hetobs_collectives_total", "hetobs_collective_bytes_total"))]}
    comm.close()
    return res


PROGRAMS = {"stats": prog_stats, "timeout": prog_timeout, "matrix": prog_matrix, "env_chunks": prog_env_chunks,
            "mismatch": prog_mismatch, "kill": prog_kill,
            "stalled_copy": prog_stalled_copy, "bad_input": prog_bad_input}


def run(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return PROGRAMS[args["case"]](ctx, args)
