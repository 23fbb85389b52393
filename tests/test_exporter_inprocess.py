"""In-process Prometheus: `hetobs.exporters.start_http_server()` inside a rank serves its own segment.

Also: the collector is safe before any data exists (a process that never called
hetobs.init), as prometheus_client's registry may collect at registration.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _telemetry_job import RankJob  # noqa: E402
from telemetry_programs import expected_bytes  # noqa: E402

from hetobs.exporters.naming import METRICS  # noqa: E402
from hetobs.exporters.prometheus import HetobsCollector  # noqa: E402
from hetobs.exporters.source import InProcessSource  # noqa: E402


@pytest.mark.slow
def test_start_http_server_serves_the_process_own_segment(tmp_path: Path) -> None:
    with RankJob("inprocess", 1, {"http": True, "rounds": 2}, workdir=tmp_path) as job:
        port = job.wait_event(0, "serving")["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        job.send("exit")
        assert job.procs[0].wait(timeout=60) == 0
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    got = {s.labels["op"]: s.value for s in fams["hetobs_collective_bytes"].samples if s.name.endswith("_total")}
    assert got == {op: float(b) for op, b in expected_bytes(1, 2).items()}
    [up] = fams["hetobs_rank_up"].samples
    assert up.labels["job_id"] == job.job_id and up.labels["rank"] == "0" and up.value == 1.0


def test_collector_before_any_segment_serves_empty_families(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    reg.register(HetobsCollector(InProcessSource(shm_dir=str(tmp_path))))
    text = generate_latest(reg).decode()
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert declared == {m.name + ("_total" if m.kind == "counter" else "") for m in METRICS}
    assert "hetobs_collective_bytes_total{" not in text
