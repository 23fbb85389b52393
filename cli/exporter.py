"""`hetobs exporter --job ID`: serve a job's live metrics to Prometheus (and OpenTelemetry).

One process per node reads the stats segment of every rank of the job on that node
(/dev/shm), so it keeps answering while a rank hangs, is stopped or holds the GIL,
and costs the ranks nothing. Modes:

- HTTP (default): /metrics on --bind:--port (127.0.0.1:9464; port 0 picks one). The
  address is printed on stderr once listening. With OTEL_EXPORTER_OTLP_ENDPOINT set
  (or --otlp-endpoint), metrics and sampled per-collective spans also go out over
  OTLP/HTTP; spans are read from the ranks' record rings every --interval seconds.
- --textfile PATH: one scrape written atomically (for node_exporter's textfile
  collector), then exit; with --interval, rewritten every interval until stopped.

Exit codes: 0 stopped by SIGTERM (or one textfile written), 2 usage error, 4 I/O
error (port taken, textfile not writable), 130 Ctrl-C.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Annotated, Any, Callable, Optional

import typer

from hetobs.config import from_env

from ._exit_codes import ExitCode
from ._jobdir import TrustDir, checked_job_dir
from ._output import Output

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")


def _logging() -> None:
    """Library log lines (bad segments, failed reads) to stderr, once per change."""
    logger = logging.getLogger("hetobs.exporters")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("hetobs exporter: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _stop_event() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


@app.callback(invoke_without_command=True)
def exporter(
    job: Annotated[str, typer.Option("--job", help="Job id (HETOBS_JOB_ID of the job).")],
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="HTTP port (0: any free one).")] = 9464,
    bind: Annotated[str, typer.Option("--bind", help="Address to listen on.")] = "127.0.0.1",
    textfile: Annotated[Optional[str], typer.Option(
        "--textfile", help="Write one scrape to this .prom file (atomically) instead of serving HTTP.")] = None,
    interval: Annotated[Optional[float], typer.Option(
        "--interval", min=0.05, help="Textfile: rewrite every N s. HTTP: read record rings for spans every N s "
        "(default 1).")] = None,
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    otlp_endpoint: Annotated[Optional[str], typer.Option(
        "--otlp-endpoint", help="OTLP/HTTP base URL (default: OTEL_EXPORTER_OTLP_ENDPOINT).")] = None,
    sample: Annotated[Optional[float], typer.Option(
        "--sample", min=0.0, max=1.0,
        help="Fraction of collectives sent as spans (default: HETOBS_OTEL_SAMPLE).")] = None,
    shm_dir: Annotated[str, typer.Option("--shm-dir", hidden=True)] = "/dev/shm",
    trust_dir: TrustDir = False,
) -> None:
    """Serve a job's live collective metrics (Prometheus /metrics, node_exporter textfile, OTLP)."""
    from hetobs.exporters.prometheus import start_http_server, write_textfile
    from hetobs.exporters.source import ShmSource

    out = Output()
    settings = from_env()
    _logging()
    source = ShmSource(job, shm_dir=shm_dir, job_dir=checked_job_dir(dir or settings.dir, job, trust_dir))
    if not source.snapshot().ranks:
        out.warning(f"no stats segment of job {job} on this node (yet)")
    if textfile is not None:
        if not textfile.endswith(".prom"):
            out.warning(f"{textfile}: node_exporter's textfile collector reads only files ending in .prom")
        _textfile(out, source, textfile, interval, write_textfile)
        return
    stop = _stop_event()
    try:
        server, _thread = start_http_server(port, bind, source=source)
    except OSError as e:
        out.error(f"cannot listen on {bind}:{port}: {e.strerror or e}")
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
    host = f"[{bind}]" if ":" in bind else bind
    out.message(f"serving job {job} on http://{host}:{server.server_port}/metrics")
    pipeline = _otel(out, source, otlp_endpoint, settings.otel_sample if sample is None else sample)
    try:
        while not stop.wait(interval or 1.0):
            if pipeline is not None:
                pipeline.poll()
    finally:
        if pipeline is not None:
            pipeline.shutdown()
        server.shutdown()
        server.server_close()
    out.message("stopped")


def _otel(out: Output, source: Any, endpoint: str | None, sample: float) -> Any:
    from hetobs.exporters.otel import OtelPipeline, otlp_configured

    if not endpoint and not otlp_configured():
        return None
    pipeline = OtelPipeline(source, sample=sample, endpoint=endpoint, resource_attributes={"hetobs.job": source.job})
    out.message(f"OpenTelemetry: OTLP/HTTP metrics and spans (sample {sample:g}) to "
                f"{endpoint or 'the OTEL_EXPORTER_OTLP_* endpoint'}")
    return pipeline


def _textfile(out: Output, source: Any, path: str, interval: float | None, write: Callable[..., Any]) -> None:
    try:
        write(path, source)
    except OSError as e:
        out.error(f"cannot write textfile {path}: {e.strerror or e}")
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
    if interval is None:
        return
    stop = _stop_event()
    failing = False
    while not stop.wait(interval):
        try:
            write(path, source)
        except OSError as e:  # keep the node agent alive through a transient failure; say so once
            if not failing:
                out.warning(f"cannot write textfile {path}: {e.strerror or e} (retrying every {interval:g} s)")
            failing = True
        else:
            if failing:
                out.message(f"textfile {path} written again")
            failing = False
