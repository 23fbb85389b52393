"""Rank-side programs for the telemetry tests and bench/scrape_bench.py.

Run as ``python tests/telemetry_programs.py <program> <json-args>`` with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT and HETOBS_* in the environment (see
tests/_telemetry_job.py). A rank talks to the test with lines on stdout that start
with ``@@ `` (JSON events) and takes commands as lines on stdin, so the test
synchronises on what the rank says, never on time.

The message sizes each op records follow nccl-tests (the native recorder's rule):
all_gather counts the gathered output, reduce_scatter and all_to_all the full input,
every other op its input (recv: its output). `expected_bytes()` computes what one
rank of `workload` records per op kind from the same table the program runs, so the
tests compare the exporter against the program, not against the exporter.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

# (op, elements per rank's input, dtype, root); repeated `rounds` times on the world.
WORKLOAD: list[tuple[str, int, str, int]] = [
    ("all_reduce", 1000, "float32", 0),
    ("all_reduce", 70000, "float32", 0),  # above HETOBS_SMALL_BYTES: the ring path
    ("all_gather", 513, "int32", 0),
    ("broadcast", 4096, "float64", 1),
    ("reduce_scatter", 1000, "float32", 0),  # per-rank block; input is world x block
    ("all_to_all", 256, "int64", 0),  # per-peer block; input is world x block
    ("reduce", 300, "float32", 2),
]
P2P_ELEMENTS = 100  # float32 sent to the next rank and received from the previous one per round


def expected_bytes(world: int, rounds: int) -> dict[str, int]:
    """Bytes one rank of `workload` records per op kind (nccl-tests sizing)."""
    out: dict[str, int] = {}
    for op, n, dt, _root in WORKLOAD:
        es = np.dtype(dt).itemsize
        if op == "all_gather":
            b = world * n * es
        elif op in ("reduce_scatter", "all_to_all"):
            b = world * n * es
        else:
            b = n * es
        out[op] = out.get(op, 0) + rounds * b
    if world > 1:
        out["send"] = rounds * P2P_ELEMENTS * 4
        out["recv"] = rounds * P2P_ELEMENTS * 4
    return out


def event(name: str, **data: Any) -> None:
    sys.stdout.write("@@ " + json.dumps({"event": name, "rank": int(os.environ["RANK"]), **data}) + "\n")
    sys.stdout.flush()


def command() -> str:
    """The next line the test sends (empty at EOF)."""
    return sys.stdin.readline().strip()


def _run_round(comm: Any) -> None:
    world, rank = comm.size, comm.rank
    for op, n, dt, root in WORKLOAD:
        if op == "all_reduce":
            comm.all_reduce(np.ones(n, dt))
        elif op == "all_gather":
            comm.all_gather(np.empty(world * n, dt), np.full(n, rank, dt))
        elif op == "broadcast":
            comm.broadcast(np.zeros(n, dt), root=root % world)
        elif op == "reduce_scatter":
            comm.reduce_scatter(np.empty(n, dt), np.ones(world * n, dt))
        elif op == "all_to_all":
            comm.all_to_all(np.empty(world * n, dt), np.arange(world * n, dtype=dt))
        elif op == "reduce":
            comm.reduce(np.ones(n, dt), root=root % world)
    if world > 1:
        w = comm.send(np.ones(P2P_ELEMENTS, np.float32), (rank + 1) % world, async_op=True)
        comm.recv(np.empty(P2P_ELEMENTS, np.float32), (rank - 1) % world)
        w.wait()


def prog_workload(args: dict[str, Any]) -> None:
    """Phase 1: `rounds` of WORKLOAD on the world, then report and wait for a command:
    `loop` (all_reduce forever; reports `looping` after the first), `one` (one all_reduce,
    reported as `entering` and `one_done`: a rank not sent it keeps the others waiting),
    `records` (print the rank's records), `exit`."""
    import hetobs

    comm = hetobs.init()
    for _ in range(int(args.get("rounds", 3))):
        _run_round(comm)
    event("phase1", pid=os.getpid())
    while True:
        cmd = command()
        if cmd == "loop":
            x = np.ones(1000, np.float32)
            comm.all_reduce(x)
            event("looping")
            while True:
                comm.all_reduce(x)
        elif cmd == "one":
            event("entering")
            comm.all_reduce(np.ones(1000, np.float32))
            event("one_done")
        elif cmd == "records":
            event("records", records=hetobs.records())
        else:
            comm.close()
            return


def prog_many_comms(args: dict[str, Any]) -> None:
    """The world plus `comms - 1` communicators of every rank (split), each running `ops`
    all_reduce + all_gather rounds; reports `ready` and holds until stdin closes."""
    import hetobs

    comm = hetobs.init()
    comms = [comm] + [comm.split(color=0) for _ in range(int(args.get("comms", 16)) - 1)]
    for c in comms:
        for _ in range(int(args.get("ops", 3))):
            c.all_reduce(np.ones(1024, np.float32))
            c.all_gather(np.empty(c.size * 64, np.float32), np.ones(64, np.float32))
    event("ready", comms=len(comms))
    command()


def prog_inprocess(args: dict[str, Any]) -> None:
    """One process exporting itself: `hetobs.exporters.start_http_server(0)` and/or
    `start_otel(sample=1)`, then `rounds` of WORKLOAD; reports `serving` with the port and
    waits for a line; then flushes OpenTelemetry (shutdown) and exits."""
    import hetobs
    from hetobs import exporters

    comm = hetobs.init()
    port = None
    if args.get("http"):
        server, _thread = exporters.start_http_server(0)
        port = server.server_port
    pipeline = exporters.start_otel(sample=1.0, interval=0.1) if args.get("otel") else None
    for _ in range(int(args.get("rounds", 1))):
        _run_round(comm)
    event("serving", port=port)
    command()
    if pipeline is not None:
        pipeline.shutdown()
    comm.close()


PROGRAMS = {"workload": prog_workload, "many_comms": prog_many_comms, "inprocess": prog_inprocess}

if __name__ == "__main__":
    PROGRAMS[sys.argv[1]](json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
