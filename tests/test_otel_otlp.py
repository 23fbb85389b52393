"""OpenTelemetry over OTLP/HTTP, received by a real receiver that decodes the protobufs.

- The node exporter (`hetobs exporter` with OTEL_EXPORTER_OTLP_ENDPOINT) sends one span
  per op of every rank, read from their record rings (HETOBS_OTEL_SAMPLE=1), with op,
  bytes, communicator, sequence id and bandwidths as attributes, and the counters as
  metrics equal to what the ranks moved.
- A rank exporting itself (`hetobs.exporters.start_otel`) does the same in-process.
- Sampling is decided per (job, comm, seq): every rank keeps the same collectives.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _otlp_receiver import OtlpReceiver  # noqa: E402
from _telemetry_job import RankJob  # noqa: E402
from telemetry_programs import WORKLOAD, expected_bytes  # noqa: E402

from hetobs.exporters.otel import sampled  # noqa: E402

WORLD, ROUNDS = 2, 2
OPS_PER_RANK = ROUNDS * (len(WORKLOAD) + 2)  # + send and recv per round


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    try:
        yield r
    finally:
        r.close()


def _op_bytes(world: int) -> dict[str, int]:
    return {op: b // ROUNDS for op, b in expected_bytes(world, ROUNDS).items() if op != "all_reduce"}


def _check_spans(spans: list, world: int, job_id: str) -> None:
    by_rank = Counter(int(dict((kv.key, kv.value.int_value) for kv in s.attributes)["hetobs.rank"]) for _, s in spans)
    assert by_rank == {r: OPS_PER_RANK if world > 1 else ROUNDS * len(WORKLOAD) for r in range(world)}
    sizes = _op_bytes(world)
    ar_sizes = sorted({n * 4 for op, n, _, _ in WORKLOAD if op == "all_reduce"})
    seqs: dict[int, list[int]] = {}
    for resource, span in spans:
        a = {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}
        assert span.name == f"hetobs.{a['hetobs.op']}"
        assert a["hetobs.job"] == job_id and a["hetobs.comm"] == "0" and a["hetobs.state"] == "completed"
        if a["hetobs.op"] == "all_reduce":
            assert a["hetobs.bytes"] in ar_sizes
        else:
            assert a["hetobs.bytes"] == sizes[a["hetobs.op"]], a
        assert span.end_time_unix_nano > span.start_time_unix_nano > 0
        assert a["hetobs.algbw_gbps"] > 0 and a["hetobs.busbw_gbps"] >= 0
        assert a["hetobs.comm_size"] == world and a["hetobs.dtype"] in ("float32", "int32", "float64", "int64")
        if a["hetobs.op"] not in ("send", "recv"):
            seqs.setdefault(a["hetobs.rank"], []).append(a["hetobs.seq"])
            # busbw = algbw x the nccl-tests factor of the op
            # (at one rank 0 for all of these: nothing crosses a link)
            factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world,
                      "reduce_scatter": (world - 1) / world, "all_to_all": (world - 1) / world}.get(a["hetobs.op"], 1)
            assert a["hetobs.busbw_gbps"] == pytest.approx(a["hetobs.algbw_gbps"] * factor)
        else:
            assert a["hetobs.peer"] in range(world)
        assert resource["service.name"] == "hetobs"
    for rank, got in seqs.items():
        assert sorted(got) == list(range(1, ROUNDS * len(WORKLOAD) + 1)), rank


@pytest.mark.slow
def test_node_exporter_sends_spans_and_metrics(tmp_path: Path, receiver: OtlpReceiver) -> None:
    with RankJob("workload", WORLD, {"rounds": ROUNDS}, workdir=tmp_path) as job:
        job.wait_all("phase1")
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "HETOBS_OTEL_SAMPLE": "1",
               "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        proc = job.helper([sys.executable, "-m", "hetobs.cli", "exporter", "--job", job.job_id, "--port", "0",
                           "--interval", "0.2"], env=env, log="exporter.log")
        job.wait_log("exporter.log", "OpenTelemetry", proc)
        want = WORLD * OPS_PER_RANK
        receiver.wait(lambda: len(receiver.spans()) >= want, 60, f"{want} spans")
        spans = receiver.spans()
        assert len(spans) == want  # each op once, though the rings are read every 0.2 s
        _check_spans(spans, WORLD, job.job_id)

        def bytes_by_rank_op() -> dict[tuple[str, str], float]:
            return {(a["rank"], a["op"]): v for a, v, _ in receiver.metric_points("hetobs_collective_bytes")}

        expected = {(str(r), op): float(b) for r in range(WORLD) for op, b in expected_bytes(WORLD, ROUNDS).items()}
        receiver.wait(lambda: bytes_by_rank_op() == expected, 30, "hetobs_collective_bytes equal to the ops' bytes")
        [(attrs, value, metric)] = [p for p in receiver.metric_points("hetobs_collective_bytes")
                                    if p[0]["rank"] == "0" and p[0]["op"] == "all_gather"]
        assert metric.unit == "By" and metric.sum.is_monotonic and attrs["job_id"] == job.job_id
        gauge = receiver.metric_points("hetobs_seconds_since_progress")
        assert sorted(a["rank"] for a, _, _ in gauge) == [str(r) for r in range(WORLD)]
        assert all(v >= 0 for _, v, _ in gauge) and gauge[0][2].unit == "s"
        states = {(a["rank"], a["state"]): v for a, v, _ in receiver.metric_points("hetobs_rank_state")}
        assert states[("0", "healthy")] == 1 and states[("1", "healthy")] == 1


@pytest.mark.slow
def test_in_process_start_otel(tmp_path: Path, receiver: OtlpReceiver) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with RankJob("inprocess", 1, {"otel": True, "rounds": ROUNDS}, workdir=tmp_path, env=env) as job:
        job.wait_event(0, "serving")
        job.send("exit")  # shutdown() flushes the spans and one last metric export
        assert job.procs[0].wait(timeout=60) == 0, job._stderr()
    spans = receiver.spans()
    _check_spans(spans, 1, job.job_id)
    got = {a["op"]: v for a, v, _ in receiver.metric_points("hetobs_collective_bytes")}
    assert got == {op: float(b) for op, b in expected_bytes(1, ROUNDS).items()}


def test_sampling_keeps_the_same_collectives_on_every_rank() -> None:
    recs = [{"op": "all_reduce", "comm_id": 7, "collective_seq_id": s, "p2p_seq_id": 0} for s in range(1, 20001)]
    kept = [sampled("job1", r, 0.05) for r in recs]
    assert 0.04 < np.mean(kept) < 0.06
    other_rank = [sampled("job1", dict(r), 0.05) for r in recs]  # what another rank decides for the same ops
    assert kept == other_rank
    assert all(sampled("j", recs[0], 1.0) for _ in range(3)) and not sampled("j", recs[0], 0.0)
