"""Time one Prometheus scrape of a job: 4 ranks x 16 communicators (target: under 50 ms).

Starts a real job (tests/telemetry_programs.py `many_comms`: each rank makes 15
communicators with comm.split next to the world and runs all_reduce and all_gather on
each, then holds), so the segments hold what a real job writes: 16 communicators,
48 links and the record ring per rank. Then times, `--scrapes` times each:

- snapshot: reading the four stats segments (ShmSource.snapshot);
- families: snapshot + metrics.families() (what OpenTelemetry's callbacks use);
- exposition: snapshot + families + prometheus_client text (generate_latest);
- HTTP GET /metrics from `hetobs exporter` running as its own process, as deployed,
  in the classic text format, and with the Accept and Accept-Encoding headers Prometheus
  sends (the exporter answers classic text, gzipped at level 1).

    .venv/bin/python bench/scrape_bench.py [--ranks 4] [--comms 16] [--scrapes 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
# What Prometheus 2.x sends when it scrapes (it then gets OpenMetrics from prometheus_client).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
sys.path.insert(0, str(ROOT / "tests"))


def _times(fn: Callable[[], object], n: int) -> list[float]:
    fn()  # warm: imports, first mmap
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000.0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--comms", type=int, default=16)
    ap.add_argument("--scrapes", type=int, default=50)
    args = ap.parse_args()

    from prometheus_client import generate_latest

    from _telemetry_job import RankJob
    from hetobs.exporters.metrics import families
    from hetobs.exporters.prometheus import make_registry
    from hetobs.exporters.source import ShmSource

    with tempfile.TemporaryDirectory() as tmp, RankJob("many_comms", args.ranks, {"comms": args.comms},
                                                        workdir=Path(tmp)) as job:
        job.wait_all("ready", timeout=120)
        source = ShmSource(job.job_id)
        snap = source.snapshot()
        comms = sum(len(e.stats.comms) for e in snap.ranks if e.stats)
        links = sum(len(e.stats.links) for e in snap.ranks if e.stats)
        registry = make_registry(source)
        text = generate_latest(registry)
        samples = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
        exporter = job.helper([sys.executable, "-m", "hetobs.cli", "exporter", "--job", job.job_id, "--port", "0"],
                              log="exporter.log")
        line = next(ln for ln in job.wait_log("exporter.log", "/metrics", exporter).splitlines() if "/metrics" in ln)
        url = "http://" + line.split("http://", 1)[1].strip()

        def http(accept: str, encoding: str = "identity") -> Callable[[], bytes]:
            def get() -> bytes:
                req = urllib.request.Request(url, headers={"Accept": accept, "Accept-Encoding": encoding})
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.read()
            return get

        rows = [
            ("snapshot (read segments)", _times(source.snapshot, args.scrapes)),
            ("snapshot + families", _times(lambda: families(source.snapshot()), args.scrapes)),
            ("exposition (generate_latest)", _times(lambda: generate_latest(registry), args.scrapes)),
            ("HTTP GET /metrics, text 0.0.4", _times(http("text/plain"), args.scrapes)),
            ("HTTP GET /metrics, as Prometheus asks (gzip)", _times(http(PROMETHEUS_ACCEPT, "gzip"), args.scrapes)),
        ]
        job.send("exit")

    print(f"`{' '.join([Path(sys.executable).name, 'bench/scrape_bench.py'] + sys.argv[1:])}` — "
          f"{len(snap.ranks)} ranks x {comms // max(1, len(snap.ranks))} communicators ({comms} comm and "
          f"{links} link entries in all), {samples} samples, "
          f"{len(text) / 1024:.0f} KiB per scrape, {args.scrapes} scrapes\n")
    print("| step | median ms | p90 ms | max ms |")
    print("| --- | ---: | ---: | ---: |")
    for name, t in rows:
        t = sorted(t)
        print(f"| {name} | {statistics.median(t):.2f} | {t[int(0.9 * (len(t) - 1))]:.2f} | {t[-1]:.2f} |")
    http_median = max(statistics.median(rows[-1][1]), statistics.median(rows[-2][1]))
    print(f"\ntarget: a scrape under 50 ms -> {'met' if http_median < 50 else 'MISSED'} "
          f"(HTTP median {http_median:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
