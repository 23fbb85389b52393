"""OpenTelemetry: observable metrics and per-collective spans, over OTLP/HTTP.

Metrics: one observable instrument per counter and gauge in naming.METRICS, whose
callbacks report the samples of `metrics.families(source.snapshot())` — the same
function the Prometheus collector renders — so the two cannot disagree. One snapshot
serves every callback of a collection (memoised for `_MEMO_S`). The two histograms
have no observable form in the OTel API and are Prometheus-only; their counts are
`hetobs_collectives` anyway.

Spans: `SpanPump` reads each rank's record ring (from the segment, so ranks without
Python — MPI, NCCL preload — get spans too) and turns finished ops into spans with
their real start and end times. Sampling is decided per (job, communicator, sequence
id), so every rank keeps the same collectives and a sampled op can be compared across
ranks.

Export: OTLP over HTTP/protobuf, configured by the standard variables
(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT, _HEADERS,
OTEL_METRIC_EXPORT_INTERVAL, OTEL_BSP_*, OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES). Global OTel providers are left alone: hetobs makes its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .metrics import BUSY_RECORDS, Family, families
from .naming import METRICS, otel_name, otel_unit
from .source import InProcessSource, SnapshotSource

__all__ = ["OtelMetrics", "SpanPump", "OtelPipeline", "start_otel", "sampled", "otlp_configured"]

log = logging.getLogger("hetobs.exporters")

_MEMO_S = 0.5
RECORD_WINDOW = 512  # newest records read per rank and poll; older unseen ones are skipped


def otlp_configured(env: dict[str, str] | None = None) -> bool:
    """True when the standard OTLP endpoint variables ask for export."""
    env = dict(os.environ) if env is None else env
    return any(env.get(k) for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                                    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def sampled(job: str, rec: dict[str, Any], rate: float) -> bool:
    """Deterministic per (job, comm, seq): every rank keeps or drops the same collective."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    if rec.get("op") in ("send", "recv"):
        key = f"{job}:{rec['comm_id']}:p{rec['p2p_seq_id']}"
    else:
        key = f"{job}:{rec['comm_id']}:c{rec['collective_seq_id']}"
    return zlib.crc32(key.encode()) / 2**32 < rate


class _Memo:
    """One snapshot's families for every callback of one metric collection."""

    def __init__(self, source: SnapshotSource) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._at = -1.0
        self._by_name: dict[str, Family] = {}

    def family(self, name: str) -> Family | None:
        with self._lock:
            if time.monotonic() - self._at > _MEMO_S:
                try:
                    self._by_name = {f.spec.name: f for f in families(self.source.snapshot(records=BUSY_RECORDS))}
                except Exception:  # telemetry failures are logged, never raised into the reader
                    log.exception("OpenTelemetry: reading the stats segments failed")
                    self._by_name = {}
                self._at = time.monotonic()
            return self._by_name.get(name)


class OtelMetrics:
    """Observable instruments on `meter_provider`, fed from `source`."""

    def __init__(self, source: SnapshotSource, meter_provider: Any) -> None:
        from opentelemetry.metrics import Observation

        self._memo = _Memo(source)
        meter = meter_provider.get_meter("hetobs.exporters")

        def callback(name: str, labels: tuple[str, ...]) -> Callable[[Any], Iterable[Any]]:
            def observe(_options: Any) -> Iterable[Any]:
                fam = self._memo.family(name)
                if fam is None:
                    return []
                return [Observation(v, dict(zip(labels, lv, strict=True))) for lv, v in fam.samples]
            return observe

        for spec in METRICS:
            if spec.kind == "histogram":
                continue
            make = meter.create_observable_counter if spec.kind == "counter" else meter.create_observable_gauge
            make(otel_name(spec), callbacks=[callback(spec.name, spec.labels)], unit=otel_unit(spec),
                 description=spec.help)


@dataclass
class _Cursor:
    high: int = -1  # highest record id looked at
    pending: set[int] = field(default_factory=set)  # ids seen unfinished, to emit once they finish


class SpanPump:
    """Emits a span per sampled, finished op of every rank's record ring, once."""

    def __init__(self, source: SnapshotSource, tracer_provider: Any, sample: float, *,
                 window: int = RECORD_WINDOW) -> None:
        self.source = source
        self.tracer = tracer_provider.get_tracer("hetobs.exporters")
        self.sample = sample
        self.window = window
        self._cursors: dict[tuple[int, int], _Cursor] = {}
        self.emitted = 0

    def poll(self) -> int:
        """Read the rings once; returns how many spans were emitted."""
        snap = self.source.snapshot(records=self.window)
        n = 0
        for entry in snap.ranks:
            st = entry.stats
            if st is None:
                continue
            cur = self._cursors.setdefault((entry.rank, st.pid), _Cursor())
            records: list[dict[str, Any]] = st.records
            oldest = int(records[0]["record_id"]) if records else 0
            cur.pending = {i for i in cur.pending if i >= oldest}  # fell out of the ring
            for rec in records:
                rid = int(rec["record_id"])
                if rid <= cur.high and rid not in cur.pending:
                    continue
                cur.high = max(cur.high, rid)
                if rec["state"] not in ("completed", "failed"):
                    cur.pending.add(rid)
                    continue
                cur.pending.discard(rid)
                if sampled(snap.job or st.job, rec, self.sample):
                    n += self._emit(snap.job or st.job, entry.rank, st.host, rec)
        self.emitted += n
        return n

    def _emit(self, job: str, rank: int, host: str, rec: dict[str, Any]) -> int:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        start = rec.get("time_discovered_started_ns") or rec.get("time_created_ns")
        end = rec.get("time_discovered_completed_ns")
        if not start or not end:
            return 0
        attrs = {
            "hetobs.job": job, "hetobs.rank": rank, "hetobs.host": host, "hetobs.comm": str(rec["comm_id"]),
            "hetobs.op": rec["op"], "hetobs.bytes": int(rec["bytes"]), "hetobs.seq": int(rec["collective_seq_id"]),
            "hetobs.p2p_seq": int(rec["p2p_seq_id"]), "hetobs.dtype": rec["dtype"], "hetobs.count": int(rec["count"]),
            "hetobs.algorithm": rec["algorithm"], "hetobs.comm_size": int(rec["comm_size"]),
            "hetobs.comm_rank": int(rec["comm_rank"]), "hetobs.algbw_gbps": float(rec["algbw_gbps"]),
            "hetobs.busbw_gbps": float(rec["busbw_gbps"]), "hetobs.record_id": int(rec["record_id"]),
            "hetobs.state": rec["state"],
        }
        if rec.get("island"):  # a hierarchical op: its island and the busy time of each phase
            attrs["hetobs.island"] = str(rec["island"])
            attrs.update({f"hetobs.{k}": int(v) for k, v in (rec.get("phases") or {}).items()})
        if rec["op"] in ("send", "recv", "broadcast", "reduce") and int(rec["root_or_peer"]) >= 0:
            attrs["hetobs.peer" if rec["op"] in ("send", "recv") else "hetobs.root"] = int(rec["root_or_peer"])
        span = self.tracer.start_span(f"hetobs.{rec['op']}", kind=SpanKind.INTERNAL, start_time=int(start),
                                      attributes=attrs)
        if rec["state"] == "failed":
            span.set_status(Status(StatusCode.ERROR, str(rec.get("error") or "failed")))
        span.end(end_time=int(end))
        return 1


class OtelPipeline:
    """Providers, instruments and the span pump of one exporter; `shutdown()` flushes both."""

    def __init__(self, source: SnapshotSource, *, sample: float, endpoint: str | None = None,
                 resource_attributes: dict[str, Any] | None = None) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        base = endpoint.rstrip("/") if endpoint else None
        attrs = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "hetobs", **(resource_attributes or {})}
        resource = Resource.create(attrs)
        self.reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics" if base else None))
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self.reader])
        self.metrics = OtelMetrics(source, self.meter_provider)
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces" if base else None)))
        self.spans = SpanPump(source, self.tracer_provider, sample)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> int:
        """Emit spans for ops finished since the last poll (logs, never raises)."""
        try:
            return self.spans.poll()
        except Exception:
            log.exception("OpenTelemetry: reading the record rings failed")
            return 0

    def run_in_background(self, interval: float = 1.0) -> "OtelPipeline":
        def loop() -> None:
            while not self._stop.wait(interval):
                self.poll()

        self._thread = threading.Thread(target=loop, name="hetobs-otel", daemon=True)
        self._thread.start()
        return self

    def flush(self, timeout_s: float = 10.0) -> None:
        self.tracer_provider.force_flush(int(timeout_s * 1000))
        self.meter_provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Stop polling, emit what finished meanwhile, export and close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def start_otel(source: SnapshotSource | None = None, *, job: str | None = None, sample: float | None = None,
               endpoint: str | None = None, interval: float = 1.0) -> OtelPipeline:
    """In-process OpenTelemetry for this rank (default source: its own segment).

    `sample` defaults to HETOBS_OTEL_SAMPLE; `endpoint` to the OTEL_EXPORTER_OTLP_*
    variables. Spans are polled from the record ring every `interval` seconds on a
    daemon thread; call `.shutdown()` at exit to flush.
    """
    from hetobs.config import from_env

    rate = from_env().otel_sample if sample is None else min(1.0, max(0.0, sample))
    src = source if source is not None else InProcessSource(job)
    return OtelPipeline(src, sample=rate, endpoint=endpoint).run_in_background(interval)
