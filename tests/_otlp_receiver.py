"""A minimal OTLP/HTTP receiver for tests: decodes what exporters POST with the opentelemetry-proto classes.

Listens on 127.0.0.1 (a free port), accepts /v1/traces and /v1/metrics
(application/x-protobuf, optionally gzip), keeps every decoded request, and lets a
test wait on a condition over them (woken by each request, so no sleeping).
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)

_KINDS = {"/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
          "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse)}


def _value(v: Any) -> Any:
    """An OTLP AnyValue as a Python value."""
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                kind = _KINDS.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if kind is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                req = kind[0]()
                req.ParseFromString(body)
                with receiver.cond:
                    (receiver.traces if kind[0] is ExportTraceServiceRequest else receiver.metrics).append(req)
                    receiver.cond.notify_all()
                out = kind[1]().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        with self.cond:
            reqs = list(self.traces)
        return [(attrs(rs.resource.attributes), span) for req in reqs for rs in req.resource_spans
                for ss in rs.scope_spans for span in ss.spans]

    def metric_points(self, name: str) -> list[tuple[dict[str, Any], Any, Any]]:
        """(attributes, value, metric) of every data point of `name` in the newest request holding it."""
        with self.cond:
            reqs = list(self.metrics)
        for req in reversed(reqs):
            out = []
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name != name:
                            continue
                        data = getattr(m, m.WhichOneof("data"))
                        for p in data.data_points:
                            value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                            out.append((attrs(p.attributes), value, m))
            if out:
                return out
        return []

    def wait(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        """Wait until check() is truthy, re-evaluated at each request received."""
        with self.cond:
            ok = self.cond.wait_for(check, timeout=timeout)
        if not ok:
            raise AssertionError(f"OTLP receiver: {what} not within {timeout}s "
                                 f"({len(self.traces)} trace and {len(self.metrics)} metric requests)")
        return ok

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


__all__ = ["OtlpReceiver", "attrs", "MessageToDict"]
