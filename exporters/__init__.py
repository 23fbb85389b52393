"""hetobs exporters (installed as `hetobs.exporters`): Prometheus, OpenTelemetry, traces.

Every exporter reads the ranks' stats segments through a `SnapshotSource`
(`source.py`) and turns a snapshot into numbers with one function
(`metrics.families`), so Prometheus, OpenTelemetry and `hetobs top` agree.

    from hetobs import exporters
    exporters.start_http_server(9464)          # this process's own segment, on /metrics

Names are loaded lazily: prometheus-client (a dependency) and the OpenTelemetry SDK
(the `telemetry` extra) are imported only by the exporter that needs them. Inside this
package import only `hetobs.…` or relative names.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["start_http_server", "write_textfile", "HetobsCollector", "ShmSource", "InProcessSource", "Snapshot",
           "families", "start_otel"]

_WHERE = {
    "start_http_server": "prometheus", "write_textfile": "prometheus", "HetobsCollector": "prometheus",
    "ShmSource": "source", "InProcessSource": "source", "Snapshot": "source", "families": "metrics",
    "start_otel": "otel",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
