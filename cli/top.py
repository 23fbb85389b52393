"""`hetobs top --job ID`: a live view of the job's ranks on this node.

Reads the ranks' stats segments (like the exporter), so it keeps showing a rank that
hangs or is stopped. Per rank: its host (and island, "node7 [b: hccl on npu]", in a
heterogeneous job; `island`, `island_library` and `island_device` in --json), state, the op in flight
with its sequence id, seconds since progress (yellow past half the threshold, red past it), busbw/algbw of the last
window, ops in it, "last %" (its share of the window's collectives it entered last: near
100/n on a healthy n-rank job, near 100 for a straggler; `last_share` and the lifetime
`last_arrivals` in --json); per link: send/receive throughput, busy share and network
bandwidth; per rank also its busy share (compute between collectives over compute plus
time inside them, `busy_share` in --json: an island well below the others waits for
them; `hetobs plan` balances it). `--once` prints one view (the window is --interval long) and exits;
`--json` (implies --once) prints it as one plain JSON document.

Who waits on whom: each rank row carries `waiting_on` (the ranks its in-flight op still
has an open message with) and `waited_on_by` (the stuck or suspect ranks waiting on it).
A rank the stuck ones wait on that itself waits on nobody — asleep in Python, busy
elsewhere, between ops — is the one holding the job up: state "blocking" (not "healthy").
States: healthy, suspect, stuck, blocking, stopped, dead, exited, unknown.

Exit codes: 0 shown, 3 no segment of the job on this node (--once), 130 never: Ctrl-C
ends the live view normally (0).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Optional

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from hetobs.config import from_env

from ._exit_codes import ExitCode
from ._jobdir import TrustDir, checked_job_dir
from ._output import Output

__all__ = ["app"]

app = typer.Typer(add_completion=False, subcommand_metavar="")

_STATE_STYLE = {"healthy": "green", "suspect": "yellow", "stuck": "bold red", "blocking": "bold magenta",
                "stopped": "yellow", "dead": "red", "exited": "dim", "unknown": "red"}


def _num(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _age(v: float | None, threshold: float) -> Text:
    if v is None:
        return Text("-")
    style = "bold red" if v >= threshold else "yellow" if v >= threshold / 2 else ""
    return Text(f"{v:.1f}", style=style)


def _ranks(v: list[int] | None) -> str:
    return ", ".join(str(x) for x in v) if v else "-"


def _busy(share: float | None) -> str:
    # compute share between collectives: an island well below the others waits for them (hetobs plan)
    return "-" if share is None else f"{share * 100:.0f}"


def _island(r: dict[str, Any]) -> str:
    """' [island: library on device]' for a rank of a heterogeneous job, else ''."""
    if not r.get("island"):
        return ""
    lib, dev = r.get("island_library"), r.get("island_device")
    return f" [{r['island']}: {lib} on {dev}]" if lib and dev else f" [{r['island']}]"


def render(doc: dict[str, Any], threshold: float) -> Group:
    """The view as rich tables (ranks, then links)."""
    window = doc["window_s"]
    ranks = Table(title=f"job {doc['job']}" + (f"  (window {window:.1f} s)" if window else ""), title_justify="left")
    for col, just in [("rank", "right"), ("host", "left"), ("pid", "right"), ("state", "left"),
                      ("in flight (comm: op #seq, age)", "left"), ("waits on", "left"), ("waited on by", "left"),
                      ("s since progress", "right"),
                      ("heartbeat s", "right"), ("busbw GB/s", "right"), ("algbw GB/s", "right"),
                      ("ops", "right"), ("hangs", "right"), ("busy %", "right"), ("last %", "right")]:
        ranks.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in doc["ranks"]:
        state = r.get("state", "unknown")
        current = "\n".join(f"{c['comm']}: {c['op']} #{c['seq']}, {c['seconds']:.1f}s" for c in r.get("current", []))
        if r.get("problem"):
            current = f"{r['problem']}: {r.get('detail') or ''}"
        host = (r.get("host") or "-") + _island(r)
        ranks.add_row(str(r["rank"]), host, str(r.get("pid", "-")),
                      Text(state, style=_STATE_STYLE.get(state, "")), Text(current or "-"),
                      Text(_ranks(r.get("waiting_on"))), Text(_ranks(r.get("waited_on_by"))),
                      _age(r.get("seconds_since_progress"), threshold), _num(r.get("heartbeat_age_s"), "{:.1f}"),
                      _num(r.get("busbw_gbps")), _num(r.get("algbw_gbps")), _num(r.get("window_ops"), "{}"),
                      str(r.get("hangs_detected", "-")), _busy(r.get("busy_share")), _busy(r.get("last_share")))
    links = Table(title="links", title_justify="left")
    for col in ("rank", "peer", "comm", "transport", "send MB/s", "recv MB/s", "busy %", "net GB/s", "rtt ms",
                "retrans"):
        links.add_column(col, justify="left" if col == "transport" else "right")
    for ln in doc["links"]:
        busy = ln.get("busy_fraction")
        links.add_row(str(ln["rank"]), str(ln["peer"]), str(ln["comm"]), ln["transport"], _num(ln.get("send_mbps")),
                      _num(ln.get("recv_mbps")), _num(None if busy is None else busy * 100, "{:.0f}"),
                      _num(ln.get("network_gbps")), _num(ln.get("rtt_ms"), "{:.2f}"),
                      _num(ln.get("retransmits"), "{}"))
    return Group(ranks, links)


@app.callback(invoke_without_command=True)
def top(
    job: Annotated[str, typer.Option("--job", help="Job id (HETOBS_JOB_ID of the job).")],
    interval: Annotated[float, typer.Option("--interval", min=0.05, help="Seconds per refresh (the window).")] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Show one view (over one --interval) and exit.")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help="One plain JSON document on stdout (implies --once).")] = False,
    threshold: Annotated[float, typer.Option(
        "--threshold", min=0.0, help="Highlight seconds since progress past this (default: the rank's hang timeout).")
    ] = 0.0,
    dir: Annotated[Optional[str], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")] = None,
    shm_dir: Annotated[str, typer.Option("--shm-dir", hidden=True)] = "/dev/shm",
    trust_dir: TrustDir = False,
) -> None:
    """Live view of a job's ranks on this node: state, op in flight, progress age, bandwidth."""
    from hetobs.exporters.metrics import BUSY_RECORDS
    from hetobs.exporters.source import ShmSource
    from hetobs.exporters.window import view

    out = Output(json_mode=json_out)
    source = ShmSource(job, shm_dir=shm_dir, job_dir=checked_job_dir(dir or from_env().dir, job, trust_dir))
    prev = source.snapshot(records=BUSY_RECORDS)
    if once or json_out:
        if not prev.ranks:
            out.error(f"no stats segment of job {job} on this node")
            raise typer.Exit(int(ExitCode.NO_DATA))
        time.sleep(interval)  # the measurement window, not a synchronisation
        doc = view(source.snapshot(records=BUSY_RECORDS), prev)
        if json_out:
            out.json(doc)
        else:
            out._stdout().print(render(doc, threshold or _default_threshold(doc)))
        return
    try:
        with Live(render(view(prev), threshold or 10.0), console=out._stdout(), auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                cur = source.snapshot(records=BUSY_RECORDS)
                doc = view(cur, prev)
                live.update(render(doc, threshold or _default_threshold(doc)), refresh=True)
                prev = cur
    except KeyboardInterrupt:
        return


def _default_threshold(doc: dict[str, Any]) -> float:
    timeouts = [r["hang_timeout_s"] for r in doc["ranks"] if r.get("hang_timeout_s")]
    return min(timeouts) if timeouts else 10.0
