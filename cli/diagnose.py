"""`hetobs diagnose`: name the faulty rank or link of a hung job, with the evidence.

Registered by cli/main.py as the sub-command "diagnose". The engine is
`hetobs.diagnosis` (a library); this module only parses options, shows a progress
bar while many dumps load, and prints the report: rich tables for people (verdicts,
evidence, per-rank state), `--json` for machines (one plain JSON document on stdout),
`--exclude-hosts` for schedulers (the hosts of blamed ranks and links, one per line),
`--html FILE` for a page to look at (hetobs.report_html). Messages go to stderr.
`--window SECONDS` judges a live job's last seconds through a fresh on-demand dump:
advisory `straggler` / `slow_link` verdicts (hetobs.diagnosis.window).

Exit codes: 0 healthy, 1 fault found, 2 usage error, 3 no usable data, 4 internal or
I/O error (raised exceptions are mapped by cli/main.py). Advisories never change them:
a crawling job with a straggler or a slow link exits 0; only a stuck one exits 1.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Optional, Union

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hetobs.diagnosis import FreshDump, Options, OptionsError, Report, Status, diagnose

from ._exit_codes import ExitCode
from ._output import Output

app = typer.Typer(add_completion=False, subcommand_metavar="")

_EXIT = {Status.HEALTHY: ExitCode.OK, Status.FAULT: ExitCode.FAULT, Status.NO_DATA: ExitCode.NO_DATA}
_MAX_RANK_ROWS = 48
_MAX_PROBLEMS = 20
_BAR_MIN_FILES = 256


class _LoadBar:
    """A transient rich progress bar on stderr, shown only on a terminal and for many files."""

    def __init__(self) -> None:
        self.err = Console(stderr=True)
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if total < _BAR_MIN_FILES or not self.err.is_terminal:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("loading dumps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=self.err, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("load", total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _request_dump(trust: bool = False) -> Any:
    """The side channel's on-demand dump request, when this build has it (else None).

    Adapts `request_dump(job_dir, timeout=...)` (hetobs.sidechannel, else hetobs.jobs)
    to the engine's `(job_dir, timeout_s) -> incident id or None`. `trust`: --trust-dir, which
    hetobs.jobs's reader of the rank files honours too.
    """
    fn = None
    for name in ("hetobs.sidechannel", "hetobs.jobs"):
        try:
            module = __import__(name, fromlist=["request_dump"])
        except ImportError:
            continue
        fn = getattr(module, "request_dump", None)
        if fn is not None:
            break
    if fn is None:
        return None

    def request(job_dir: Path, timeout_s: float) -> Union[None, str, FreshDump]:
        result = fn(str(job_dir), timeout=timeout_s, **({"trust": True} if trust else {}))
        if isinstance(result, str) or result is None:
            return result
        answered = getattr(result, "answered", None)
        unanswered = getattr(result, "unanswered", None) or {}
        # Who did not answer is evidence too (a whole host cut off answers nobody).
        return FreshDump(getattr(result, "incident", None) if answered else None,
                         {int(r): str(why) for r, why in unanswered.items()})

    return request


def _heartbeat(segment: str) -> Optional[int]:
    """Last watchdog heartbeat from a rank's stats segment on this host (None if unreadable)."""
    try:
        from hetobs.stats import read_segment

        return int(read_segment(segment).heartbeat_ns) or None
    except Exception:
        return None


def _last_progress(job: str) -> Any:
    def last(job_dir: Path) -> Optional[int]:
        try:
            from hetobs.stats import read_segment, segment_paths

            values = [read_segment(p).last_progress_ns for p in segment_paths(job)]
        except Exception:
            return None
        return max((v for v in values if v), default=None)

    return last


def _stdout() -> Console:
    tty = hasattr(sys.stdout, "isatty") and sys.stdout.isatty()
    return Console(file=sys.stdout, width=None if tty else 200, highlight=False, soft_wrap=False)


def _who(v: Any) -> str:
    parts = []
    if v.ranks:
        parts.append("rank " + ", ".join(str(r) for r in v.ranks[:8]) + (" …" if len(v.ranks) > 8 else ""))
    if v.links:
        parts.append(", ".join(f"{s}->{d}" for s, d in v.links))
    return "; ".join(parts) or "-"


def render(report: Report) -> None:
    """The report for people: status line, verdicts, evidence, per-rank state, data problems."""
    out = _stdout()
    style = {"fault": "bold red", "healthy": "bold green", "no_data": "bold yellow"}[report.status.value]
    head = Text(f"job {report.job}")
    if report.incident:
        head.append(f", incident {report.incident}")
    head.append(f" ({report.source}, {report.world_size or '?'} ranks): ")
    head.append(report.status.value.upper(), style=style)
    out.print(head)
    if report.suspicion is not None:  # a suspected hang: resolved (slow, not hung), or not (yet)
        out.print(Text(str(report.suspicion.get("summary")),
                       style="green" if report.suspicion.get("state") == "resolved" else "yellow"))

    if report.verdicts:
        t = Table(title="verdicts", title_justify="left")
        for col in ("#", "kind", "who", "comm", "seq", "op", "conf", "summary"):
            t.add_column(col, justify="right" if col in ("#", "seq", "conf") else "left")
        for i, v in enumerate(report.verdicts, 1):
            kind = Text(v.kind.value, style="red" if v.kind.is_fault else "yellow")
            t.add_row(str(i), kind, Text(_who(v)), Text(str(v.comm) if v.comm is not None else "-"),
                      str(v.seq) if v.seq is not None else "-", Text(v.op or "-"), f"{v.confidence:.2f}",
                      Text(v.summary))
        out.print(t)
        out.print(Text("evidence", style="bold"))
        for i, v in enumerate(report.verdicts, 1):
            out.print(Text(f"{i}. {v.summary}"))
            for line in v.evidence:
                out.print(Text(f"   - {line}"))

    if report.ranks:
        _render_ranks(out, report)
    if report.data_problems:
        t = Table(title=f"data problems ({len(report.data_problems)})", title_justify="left")
        t.add_column("file")
        t.add_column("problem")
        for p in report.data_problems[:_MAX_PROBLEMS]:
            t.add_row(Text(p.path), Text(p.problem))
        out.print(t)
        if len(report.data_problems) > _MAX_PROBLEMS:
            out.print(Text(f"... and {len(report.data_problems) - _MAX_PROBLEMS} more (see --json)"))
    for note in report.notes:
        out.print(Text(f"note: {note}", style="dim"))
    if report.exclude_hosts:
        out.print(Text("exclude hosts: " + " ".join(report.exclude_hosts)))


def _render_ranks(out: Console, report: Report) -> None:
    """Per-rank state. At scale only the unusual ranks get a row; the rest are counted."""
    rows = report.ranks
    common: Counter[tuple[Any, Any, Any, str]] = Counter((r.comm, r.op, r.seq, r.state) for r in rows)
    if len(rows) > _MAX_RANK_ROWS:
        usual = common.most_common(1)[0][0]
        shown = [r for r in rows if (r.comm, r.op, r.seq, r.state) != usual][:_MAX_RANK_ROWS]
    else:
        usual, shown = None, rows
    t = Table(title="ranks", title_justify="left")
    for col in ("rank", "host", "comm", "op", "seq", "state", "waiting on"):
        t.add_column(col, justify="right" if col in ("rank", "seq") else "left")
    for r in shown:
        t.add_row(str(r.rank), Text(r.host or "-"), Text(str(r.comm) if r.comm is not None else "-"),
                  Text(r.op or "-"), str(r.seq) if r.seq is not None else "-", Text(r.state),
                  Text(", ".join(str(x) for x in r.waiting_on) or "-"))
    out.print(t)
    if usual is not None:
        n = common[usual]
        comm, op, seq, state = usual
        out.print(Text(f"... {n} other rank(s): {state} in {op or '-'} seq {seq if seq is not None else '-'} "
                       f"on comm {comm}" + (f" ({len(rows) - n - len(shown)} more unusual not shown)"
                                            if len(rows) - n > len(shown) else "")))


@app.callback(invoke_without_command=True)
def diagnose_cmd(
    job: Annotated[Optional[str], typer.Option("--job", help="Job id: diagnose $HETOBS_DIR/<job>/.")] = None,
    dir: Annotated[Optional[Path], typer.Option("--dir", help="Root of job directories (default: HETOBS_DIR).")]
    = None,
    incident: Annotated[Optional[str], typer.Option("--incident", help="Incident to judge (default: the latest "
                                                                       "by its dumps' time).")] = None,
    fr: Annotated[Optional[Path], typer.Option("--fr", help="Read PyTorch Flight Recorder dumps from this "
                                                            "directory instead of a hetobs job.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one plain JSON document.")] = False,
    exclude_hosts: Annotated[bool, typer.Option("--exclude-hosts", help="Print only the hosts of blamed ranks and "
                                                                        "links, one per line.")] = False,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write the incident as one self-contained "
                                                                "HTML page to this file.")] = None,
    trust_dir: Annotated[bool, typer.Option("--trust-dir", help="Read a job directory owned by another user "
                                                                "or writable by others (refused by default: its "
                                                                "files could be planted).")] = False,
    window: Annotated[Optional[float], typer.Option("--window", help="Live job: judge its last SECONDS through a "
                                                                     "fresh on-demand dump (advisory straggler and "
                                                                     "slow_link; exit 0 unless something is stuck).",
                                                    metavar="SECONDS")] = None,
) -> None:
    """Localize the faulty rank or link of a hung or failed job, with evidence."""
    say = Output(json_mode=as_json)
    if (job is None) == (fr is None):
        raise typer.BadParameter("give --job ID (a hetobs job) or --fr DIR (Flight Recorder dumps), not both",
                                 param_hint="--job/--fr")
    if fr is not None and (incident is not None or dir is not None or window is not None):
        raise typer.BadParameter("--incident, --dir and --window apply to --job only", param_hint="--fr")
    if window is not None and not 0 < window < float("inf"):
        raise typer.BadParameter(f"{window} is not a positive number of seconds", param_hint="--window")
    if window is not None and incident is not None:
        raise typer.BadParameter("--window judges a fresh dump of the live job; --incident names an old one",
                                 param_hint="--window")
    if html is not None and not html.expanduser().parent.is_dir():
        say.error(f"--html {html}: the folder {html.expanduser().parent} does not exist")
        raise typer.Exit(int(ExitCode.USAGE))
    if job is not None:
        if "/" in job or job in (".", ".."):
            raise typer.BadParameter(f"{job!r} is not a job id (a plain name)", param_hint="--job")
        if dir is None:
            from hetobs.config import from_env

            dir = Path(from_env().dir)
        options = Options(job_dir=dir / job, job=job, incident=incident, request_dump=_request_dump(trust_dir),
                          heartbeat=_heartbeat, last_progress=_last_progress(job), trust_dir=trust_dir,
                          window_s=window)
    else:
        options = Options(fr_dir=fr)
    bar = _LoadBar()
    options = _with_progress(options, bar)
    try:
        report = diagnose(options)
    except OptionsError as e:
        say.error(str(e))
        raise typer.Exit(int(ExitCode.USAGE)) from None
    finally:
        bar.close()

    if exclude_hosts:
        if as_json:
            say.json(report.exclude_hosts)
        else:
            for h in report.exclude_hosts:
                sys.stdout.write(h + "\n")
    elif as_json:
        say.json(report.to_dict())
    else:
        render(report)
    if html is not None:
        write_html(say, html, report, options)
    if report.status == Status.NO_DATA:
        # One line naming what was refused or missing, as dump, top, trace and plan say it.
        first = report.data_problems[0] if report.data_problems else None
        why = f"{first.path}: {first.problem}" if first else "no dumps"
        say.error(f"no usable data: {why}")
        for note in report.notes:
            say.hint(note)
    raise typer.Exit(int(_EXIT[report.status]))


def write_html(say: Output, path: Path, report: Report, options: Options) -> None:
    """Write the HTML page of `report` to `path` (atomically); an unwritable path exits 4 with one line."""
    import os
    import tempfile

    from hetobs.report_html import load_for_report, render_html

    page = render_html(report, load_for_report(options, report))
    path = path.expanduser()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(page)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        say.error(f"--html {path}: cannot write the report: {e.strerror or e}")
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
    say.message(f"wrote the HTML report to {path} ({len(page.encode()) / 1e6:.2f} MB)")


def _with_progress(options: Options, bar: _LoadBar) -> Options:
    from dataclasses import replace

    return replace(options, progress=bar)


if __name__ == "__main__":
    app()
