"""`hetobs bench`: the hetobs native transport, torch's Gloo and Open MPI, side by side, in nccl-tests terms.

Registered by cli/main.py as the sub-command "bench" (`_add_optional("bench")`, i.e.
`app.add_typer(bench.app, name="bench")`). Tables go to stdout, progress and warnings
to stderr; `--json` prints one plain JSON array of rows on stdout.
Exit codes: 0 every requested backend ran (Gloo is skipped with a warning when torch is
missing, Open MPI when mpirun or mpi4py is), 2 usage error, 4 a backend failed or a hetobs backend could not run (the
native core is not built); rows of the backends that did run are still printed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from hetobs.bench import (
    BACKENDS,
    BINDINGS,
    DTYPES,
    OPS,
    BenchConfig,
    BenchError,
    BenchResult,
    Progress,
    backend_unavailable,
    format_size,
    parse_size,
    parse_sizes,
    run_bench,
)

from hetobs.bench.overhead import OverheadResult
from hetobs.bench.relay import RelayBenchResult

from ._exit_codes import ExitCode
from ._output import Output

# subcommand_metavar="": a command, not a group, so help shows no "COMMAND [ARGS]...".
app = typer.Typer(add_completion=False, subcommand_metavar="")

def _split_backends(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(b.strip() for b in text.split(",") if b.strip()))
    if not names:
        raise typer.BadParameter("expected a comma-separated list, e.g. hetobs-shm,hetobs-tcp,gloo",
                                 param_hint="--backends")
    for b in names:
        if b not in BACKENDS:
            raise typer.BadParameter(f"{b!r} is not one of {', '.join(BACKENDS)}", param_hint="--backends")
    return names


class _Reporter:
    """Progress on stderr: a live bar on a terminal, a line per repetition otherwise."""

    def __init__(self, err: Console, quiet: bool) -> None:
        self.err, self.quiet = err, quiet
        self.bar: Any = None
        self.task: Any = None
        self.last_rep = ""

    def __enter__(self) -> "_Reporter":
        if self.err.is_terminal and not self.quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=self.err, transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("starting", total=None)
        return self

    def __call__(self, p: Progress) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(self.task, description=p.message, completed=p.done, total=p.total or None)
            return
        rep = p.message.split("  ")[0] if p.message.startswith("rep ") else p.message
        if rep != self.last_rep:
            self.last_rep = rep
            self.err.print(f"[dim]bench: {rep}[/dim]", highlight=False)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(result: BenchResult, out: Console) -> None:
    """nccl-tests style tables: one per backend, then busbw side by side."""
    cfg = result.config
    cores = os.cpu_count() or 0
    memcpy = (f"memcpy {result.memcpy_gbs:.2f} GB/s ({format_size(cfg.memcpy_bytes or 0)} numpy copy, best of 5)"
              if result.memcpy_gbs else "memcpy not measured")
    over = " (oversubscribed: more ranks than cores)" if cores and cfg.ranks > cores else ""
    over += ", rank r bound to CPU r mod CPUs" if cfg.bind == "core" else ""
    model = result.rows[0].cpu_model if result.rows else ""
    out.print(f"# hetobs bench: {cfg.op}, {cfg.ranks} ranks on {cores} cores ({model}){over}, {cfg.dtype}, "
              f"{cfg.reps} reps{' (quick)' if cfg.quick else ''}; {memcpy}", highlight=False)
    if result.copies is not None:
        c = result.copies
        kernel = (f"the kernel's cross-process copy (process_vm_readv) {c.kernel_gbs:.1f} GB/s = "
                  f"{c.kernel_of_memcpy:.2f} of memcpy" if c.kernel_gbs and c.kernel_of_memcpy is not None
                  else "the kernel's cross-process copy refused here")
        out.print(f"# copies in cache ({format_size(c.nbytes)}): memcpy {c.memcpy_gbs:.1f} GB/s, {kernel}",
                  highlight=False)
    out.print("# time = max over ranks of each rank's median batch average; algbw = size/time; "
              "busbw = algbw x nccl-tests factor; cpu = CPU time per op of one rank (all its threads, "
              "mean over ranks)", highlight=False)
    backends = [b for b in cfg.backends if any(r.backend == b for r in result.rows)]
    has_gloo = "gloo" in backends
    has_ompi = "ompi" in backends
    for b in backends:
        rows = [r for r in result.rows if r.backend == b]
        t = Table(show_edge=False, pad_edge=False)
        for name in ("size (B)", "count", "type", "redop", "root", "time (us)", "cpu (us)", "algbw (GB/s)",
                     "busbw (GB/s)"):
            t.add_column(name, justify="left" if name in ("type", "redop") else "right")
        if has_gloo and b != "gloo":
            t.add_column("busbw/gloo", justify="right")
        if has_ompi and b != "ompi":
            t.add_column("busbw/ompi", justify="right")
        t.add_column("busbw/memcpy", justify="right")
        for r in rows:
            cells = [str(r.size), str(r.count), r.type, r.redop, str(r.root), f"{r.time_us:.1f}",
                     _num(r.cpu_us, "{:.1f}"), f"{r.algbw:.3f}", f"{r.busbw:.3f}"]
            if has_gloo and b != "gloo":
                cells.append(_num(r.busbw_vs_gloo))
            if has_ompi and b != "ompi":
                cells.append(_num(r.busbw_vs_ompi))
            cells.append(_num(r.busbw_of_memcpy, "{:.1%}"))
            t.add_row(*cells)
        out.print()
        out.print(f"{b}: {cfg.op}, {cfg.ranks} ranks", highlight=False)
        out.print(t)
    if len(backends) > 1:
        t = Table(show_edge=False, pad_edge=False)
        t.add_column("size", justify="right")
        for b in backends:
            t.add_column(b, justify="right")
        ratios = [b for b in backends if b != "gloo"] if has_gloo else []
        for b in ratios:
            t.add_column(f"{b}/gloo", justify="right")
        vs_ompi = [b for b in backends if b != "ompi"] if has_ompi else []
        for b in vs_ompi:
            t.add_column(f"{b}/ompi", justify="right")
        by = {(r.backend, r.size): r for r in result.rows}
        for size in dict.fromkeys(r.size for r in result.rows):
            cells = [format_size(size)]
            cells += [_num(by[(b, size)].busbw, "{:.3f}") if (b, size) in by else "-" for b in backends]
            cells += [_num(by[(b, size)].busbw_vs_gloo) if (b, size) in by else "-" for b in ratios]
            cells += [_num(by[(b, size)].busbw_vs_ompi) if (b, size) in by else "-" for b in vs_ompi]
            t.add_row(*cells)
        out.print()
        out.print(f"busbw (GB/s) side by side, {cfg.op}, {cfg.ranks} ranks", highlight=False)
        out.print(t)


@app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    ranks: Annotated[int, typer.Option("--ranks", "-n", min=1, help="Ranks (processes) per backend.")] = 2,
    op: Annotated[str, typer.Option("--op", help=f"Collective: {', '.join(OPS)}.")] = "all_reduce",
    backends: Annotated[str, typer.Option("--backends", help=f"Comma-separated, from {', '.join(BACKENDS)}.")]
    = "hetobs-shm,hetobs-tcp,gloo,ompi",
    sizes: Annotated[Optional[str], typer.Option(
        "--sizes", help="Comma-separated sizes in bytes, K/M/G suffixes (default 8 B, then powers of 4 from "
                        "64 B to 64 MiB; with --quick 8,64K,1M,16M).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A few sizes, few iterations, 3 reps: a demo.")] = False,
    reps: Annotated[Optional[int], typer.Option("--reps", min=1, help="Repetitions (default 5, 3 with --quick).")]
    = None,
    dtype: Annotated[str, typer.Option("--dtype", help=f"Element type: {', '.join(DTYPES)}.")] = "float32",
    as_json: Annotated[bool, typer.Option("--json", help="Print plain JSON rows on stdout instead of tables.")]
    = False,
    save: Annotated[Optional[Path], typer.Option("--save", help="Also write the JSON rows to this file.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1.0, help="Seconds one batch may take before the "
                                                                      "backend is declared failed.")] = 120.0,
    bind: Annotated[str, typer.Option("--bind", help="none: ranks where the scheduler puts them (Open MPI: its "
                                                     "default binding); core: rank r on CPU r mod CPUs, every "
                                                     "backend alike.")] = "none",
) -> None:
    """Measure collectives on hetobs-shm, hetobs-tcp, Gloo and Open MPI (mpi4py), interleaved in one run.
    `hetobs bench relay`: the pipelined host relay; `hetobs bench overhead`: the cost of watching a DDP
    training step (see their --help)."""
    if ctx.invoked_subcommand is not None:
        return
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    say = Output(json_mode=as_json)
    if op not in OPS:
        raise typer.BadParameter(f"{op!r} is not one of {', '.join(OPS)}", param_hint="--op")
    if dtype not in DTYPES:
        raise typer.BadParameter(f"{dtype!r} is not one of {', '.join(DTYPES)}", param_hint="--dtype")
    if bind not in BINDINGS:
        raise typer.BadParameter(f"{bind!r} is not one of {', '.join(BINDINGS)}", param_hint="--bind")
    names = _split_backends(backends)
    try:
        size_list = parse_sizes(sizes) if sizes is not None else None
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--sizes") from None

    code = ExitCode.OK
    for b in names:
        why = backend_unavailable(b)
        if why is not None:  # run_bench skips it too; say so before a long run, not after
            say.warning(f"skipping {b}: {why}")
            if b not in ("gloo", "ompi"):  # peers to compare with, not ours: a missing one is no failure
                code = ExitCode.INTERNAL

    cfg = BenchConfig(ranks=ranks, op=op, backends=names, sizes=size_list, reps=reps, dtype=dtype, quick=quick,
                      timeout_s=timeout, bind=bind)
    with _Reporter(err, quiet=False) as reporter:
        result = run_bench(cfg, progress=reporter)

    for note in result.notes:
        say.warning(note)
    for b, why in result.failures.items():
        say.error(f"{b} failed: {why}")
        code = ExitCode.INTERNAL
    if not result.rows:
        say.error("no backend produced results")
        code = ExitCode.INTERNAL

    rows = result.to_dicts()
    if save is not None:
        try:
            save.parent.mkdir(parents=True, exist_ok=True)
            save.write_text(json.dumps(rows, indent=2) + "\n")
        except OSError as e:
            say.error(f"cannot write {save}: {e}")
            code = ExitCode.INTERNAL
    if as_json:
        say.json(rows)
    elif result.rows:
        tty = hasattr(sys.stdout, "isatty") and sys.stdout.isatty()
        render(result, Console(file=sys.stdout, width=None if tty else 200, highlight=False, soft_wrap=False))
    raise typer.Exit(int(code))


def render_relay(result: "RelayBenchResult", out: Console) -> None:
    cfg = result.config
    if cfg.device:
        where = (f"stage device on the stand-in accelerator '{cfg.device}' (copy engines paced at "
                 f"{cfg.copy_gbps:g} GB/s)" if cfg.copy_gbps else f"stage device on '{cfg.device}' (unpaced)")
    else:
        where = "stage host (memcpy copy threads)"
    wire = f"tcp through a veth pair paced at {cfg.wire_gbps:g} GB/s" if cfg.wire_gbps else cfg.transport
    out.print(f"# hetobs bench relay: 2 ranks ({wire}) on {os.cpu_count() or 0} cores, each sends and receives SIZE; "
              f"{where}; chunk {format_size(cfg.chunk_bytes)} x {cfg.slots} slots; {cfg.reps} reps, interleaved",
              highlight=False)
    out.print("# busbw GB/s = bytes per direction / time (max over ranks of the median); ratio = pipelined/unpipelined;"
              " efficiency = pipelined / slowest stage; cores busy = CPU s of both ranks / wall s", highlight=False)
    stages = [v for v in cfg.variants if v not in ("pipelined", "unpipelined")]
    t = Table(show_edge=False, pad_edge=False)
    for name in ("size", "pipelined", "unpipelined", *stages, "ratio", "efficiency", "slowest",
                 "cores busy " + "/".join(v[0] if v not in ("d2h", "h2d") else v for v in cfg.variants)):
        t.add_column(name, justify="right")
    for r in result.rows:
        busy = "/".join(f"{r.cores.get(v, 0):.2f}" for v in cfg.variants)
        t.add_row(format_size(r.size), f"{r.pipelined:.3f}", f"{r.unpipelined:.3f}",
                  *(f"{r.stages[v]:.3f}" for v in stages), f"{r.ratio:.2f}", f"{r.efficiency:.2f}", r.bottleneck,
                  busy)
    out.print(t)


@app.command("relay")
def relay(
    sizes: Annotated[Optional[str], typer.Option("--sizes", help="Comma-separated sizes, K/M/G suffixes "
                                                                   "(default 1M,4M,16M,64M,256M).")] = None,
    reps: Annotated[int, typer.Option("--reps", min=1, help="Repetitions (interleaved rounds).")] = 3,
    chunk: Annotated[str, typer.Option("--chunk", help="Chunk size (HETOBS_RELAY_CHUNK_BYTES).")] = "4M",
    slots: Annotated[int, typer.Option("--slots", min=1, help="Staging slots each way (HETOBS_RELAY_SLOTS).")]
    = 16,
    transport: Annotated[str, typer.Option("--transport", help="shm or tcp.")] = "shm",
    device: Annotated[Optional[str], typer.Option(
        "--device", help="standin: relay tensors of the stand-in accelerator (hetobs_standin, built by "
                         "scripts/setup.sh) through stage device, against its copy engines alone.")] = None,
    copy_gbps: Annotated[float, typer.Option("--copy-gbps", min=0.0, help="With --device: pace the device's copy "
                                                                          "engines (GB/s; 0 unpaced).")] = 0.0,
    wire_gbps: Annotated[Optional[float], typer.Option(
        "--wire-gbps", min=0.001, help="Root: run the ranks in two network namespaces joined by a veth pair "
                                       "limited to this rate (tc tbf), over TCP.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print plain JSON rows on stdout instead of a table.")]
    = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1.0, help="Seconds the whole run may take.")] = 900.0,
) -> None:
    """The pipelined relay against the unpipelined one and against each stage alone, 2 ranks: host staging
    (copy: chunk-sized memcpy on one copy thread; wire: the same bytes with stage none), or with --device
    the stand-in accelerator's tensors (d2h and h2d: its copy engines alone)."""
    from hetobs.bench.relay import RELAY_SIZES, RelayBenchConfig, run_relay_bench

    say = Output(json_mode=as_json)
    if transport not in ("shm", "tcp"):
        raise typer.BadParameter(f"{transport!r} is not one of shm, tcp", param_hint="--transport")
    try:
        size_list = parse_sizes(sizes) if sizes is not None else RELAY_SIZES
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--sizes") from None
    try:
        chunk_bytes = parse_size(chunk)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--chunk") from None
    if chunk_bytes < 1:
        raise typer.BadParameter("must be at least 1 byte", param_hint="--chunk")
    if device is not None and device != "standin":
        raise typer.BadParameter(f"{device!r}: the benchmark knows the stand-in accelerator 'standin'",
                                 param_hint="--device")
    if device is not None:
        try:
            import hetobs_standin  # noqa: F401
        except ImportError:
            say.error("--device standin needs the stand-in accelerator (hetobs_standin): scripts/setup.sh builds it")
            raise typer.Exit(int(ExitCode.USAGE)) from None
    if copy_gbps and device is None:
        raise typer.BadParameter("paces a device's copy engines: give --device too", param_hint="--copy-gbps")
    if wire_gbps is not None and os.geteuid() != 0:
        raise typer.BadParameter("a paced wire needs root (network namespaces, tc)", param_hint="--wire-gbps")
    cfg = RelayBenchConfig(sizes=size_list, reps=reps, chunk_bytes=chunk_bytes, slots=slots, transport=transport,
                           timeout_s=timeout, device=device, copy_gbps=copy_gbps, wire_gbps=wire_gbps)
    result = run_relay_bench(cfg)
    if result.failure is not None:
        say.error(f"relay benchmark failed: {result.failure}")
        raise typer.Exit(int(ExitCode.INTERNAL))
    if as_json:
        say.json(result.to_dicts())
    else:
        render_relay(result, Console(file=sys.stdout, width=200, highlight=False, soft_wrap=False))
    raise typer.Exit(int(ExitCode.OK))


def render_overhead(result: "OverheadResult", out: Console) -> None:
    cfg = result.config
    loads = " -> ".join(f"{a:.2f}" for a, _, _ in result.loadavg)
    out.print(f"# hetobs bench overhead: DDP step of an MLP (Linear 1024-2048-2048-1, {result.params / 1e6:.1f} M "
              f"parameters, batch 32, 1 torch thread), {cfg.steps} steps per batch, {cfg.rounds} interleaved rounds, "
              f"{os.cpu_count() or 0} cores, load average {loads}", highlight=False)
    out.print("# step = median over rounds of the slowest rank's median step; CPU = all threads of all ranks "
              "(+ the exporter's process when scraped) per step; overheads against gloo in the same rounds",
              highlight=False)
    t = Table(show_edge=False, pad_edge=False)
    for name in ("ranks", "variant", "step (ms)", "overhead", "CPU/step (ms)", "CPU overhead", "scrapes"):
        t.add_column(name, justify="left" if name == "variant" else "right")
    for r in result.rows:
        t.add_row(str(r.ranks), r.variant, f"{r.step_ms:.2f}", "-" if r.overhead is None else f"{r.overhead:+.1%}",
                  f"{r.cpu_ms:.2f}", "-" if r.cpu_overhead is None else f"{r.cpu_overhead:+.1%}",
                  str(r.scrapes) if r.variant == "hetobs_gloo_scraped" else "-")
    out.print(t)


@app.command("overhead")
def overhead(
    ranks: Annotated[str, typer.Option("--ranks", "-n", help="World sizes, comma-separated.")] = "2,4",
    variants: Annotated[Optional[str], typer.Option(
        "--variants", help="Comma-separated, from gloo, hetobs_gloo, hetobs_gloo_py, hetobs_gloo_scraped, hetobs "
                           "(default: all; gloo is the baseline and always runs).")] = None,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Interleaved rounds.")] = 7,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps per batch.")] = 30,
    as_json: Annotated[bool, typer.Option("--json", help="Print plain JSON rows on stdout instead of a table.")]
    = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1.0, help="Seconds one batch may take.")] = 300.0,
) -> None:
    """The cost of watching: a DDP training step on plain Gloo against hetobs_gloo (C++ wrapper, Python
    fallback, exporter scraped every second) and the native hetobs backend, interleaved (docs/PERF.md)."""
    from hetobs.bench.overhead import VARIANTS, OverheadConfig, run_overhead

    say = Output(json_mode=as_json)
    try:
        world = tuple(int(x) for x in ranks.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"{ranks!r}: expected comma-separated integers, e.g. 2,4",
                                 param_hint="--ranks") from None
    names = tuple(dict.fromkeys(["gloo", *(v.strip() for v in (variants or ",".join(VARIANTS)).split(",")
                                           if v.strip())]))
    cfg = OverheadConfig(world_sizes=world, variants=names, rounds=rounds, steps=steps, timeout_s=timeout)
    try:
        cfg.check()
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    why = backend_unavailable("gloo")  # every variant is a torch job
    if why is not None:
        say.error(f"cannot run the overhead benchmark: {why}")
        raise typer.Exit(int(ExitCode.INTERNAL))
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        result = run_overhead(cfg, progress=lambda msg: err.print(f"[dim]bench: {msg}[/dim]", highlight=False))
    except BenchError as e:
        say.error(f"overhead benchmark failed: {e}")
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
    if as_json:
        say.json([r.to_dict() for r in result.rows])
    else:
        render_overhead(result, Console(file=sys.stdout, width=200, highlight=False, soft_wrap=False))
    raise typer.Exit(int(ExitCode.OK))


if __name__ == "__main__":
    app()
