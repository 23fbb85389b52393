"""Smoke tests of `hetobs bench` (hetobs/bench, cli/bench.py).

They check that the benchmark runs, that its rows hold sane positive numbers, and that
the nccl-tests bandwidth arithmetic is right. They never assert speed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from hetobs.bench import (
    DEFAULT_SIZES,
    OPS,
    QUICK_SIZES,
    BenchConfig,
    bus_factor,
    element_count,
    format_size,
    parse_size,
    parse_sizes,
    plan_iters,
    run_bench,
)
from hetobs.bench.copy_probe import measure_copies
from hetobs.bench.rows import table_rows
from hetobs.bench.units import cpu_model

_HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not _HAVE_TORCH, reason="torch is not installed (Gloo backend)")


# -- arithmetic ----------------------------------------------------------------------------

def _expected_factor(op: str, n: int) -> float:
    # nccl-tests: src/all_reduce.cu, all_gather.cu, reduce_scatter.cu, alltoall.cu, broadcast.cu, ...
    return {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "gather": (n - 1) / n,
        "scatter": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "send": 1.0,
        "recv": 1.0,
    }[op]


@pytest.mark.parametrize("op", list(OPS) + ["gather", "scatter", "reduce", "send", "recv"])
@pytest.mark.parametrize("n", list(range(1, 17)) + [64, 1000])
def test_bus_factor_matches_nccl_tests(op: str, n: int) -> None:
    assert bus_factor(op, n) == pytest.approx(_expected_factor(op, n), rel=0, abs=1e-15)


def test_bus_factor_known_values() -> None:
    assert bus_factor("all_reduce", 1) == 0.0
    assert bus_factor("all_reduce", 2) == 1.0
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_reduce", 8) == 1.75
    assert bus_factor("all_gather", 2) == 0.5
    assert bus_factor("reduce_scatter", 4) == 0.75
    assert bus_factor("all_to_all", 8) == 0.875
    assert bus_factor("broadcast", 1) == bus_factor("broadcast", 7) == 1.0


def test_bus_factor_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="rank"):
        bus_factor("all_reduce", 0)
    with pytest.raises(ValueError, match="op="):
        bus_factor("no_such_op", 2)


def test_parse_sizes() -> None:
    assert parse_size("8") == 8
    assert parse_size("4K") == parse_size("4k") == parse_size("4KiB") == parse_size("4KB") == 4096
    assert parse_size("1M") == parse_size("1MiB") == 1 << 20
    assert parse_size("64M") == 64 << 20
    assert parse_size("1G") == 1 << 30
    assert parse_size("0.5K") == 512
    assert parse_sizes("8,1M,64M") == (8, 1 << 20, 64 << 20)
    assert parse_sizes("8, 8 ,4K,") == (8, 4096)
    for bad in ("", "x", "-1", "0", "1.5", "4Q"):
        with pytest.raises(ValueError):
            parse_sizes(bad) if bad == "" else parse_size(bad)


def test_default_sizes_and_iterations() -> None:
    assert DEFAULT_SIZES[0] == 8 and DEFAULT_SIZES[-1] == 64 << 20
    assert all(b == a * 4 for a, b in zip(DEFAULT_SIZES[1:], DEFAULT_SIZES[2:]))  # powers of 4
    assert max(QUICK_SIZES) >= 16 << 20  # the memcpy fraction shows in the demo
    for quick in (False, True):
        plans = [plan_iters(s, quick) for s in DEFAULT_SIZES]
        assert all(w >= 1 and i >= 2 for w, i in plans)
        iters = [i for _, i in plans]
        assert iters == sorted(iters, reverse=True)  # fewer iterations as sizes grow
    assert format_size(8) == "8 B" and format_size(4096) == "4 KiB" and format_size(64 << 20) == "64 MiB"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_element_count(n: int) -> None:
    for op in OPS:
        for size in (1, 8, 12, 4096, 1 << 20):
            count = element_count(op, size, n, 4)
            assert count >= 1
            if op in ("all_gather", "reduce_scatter", "all_to_all"):
                assert count % n == 0 and count >= n
                assert count * 4 <= max(size, n * 4)
            else:
                assert count == max(1, size // 4)


def test_rows_follow_nccl_tests_math() -> None:
    """time = max over ranks of each rank's median; algbw = size/time; busbw = algbw x factor."""
    cfg = BenchConfig(ranks=4, op="all_reduce", backends=("hetobs-shm", "gloo"), sizes=(4096, 32 << 20),
                      reps=3).resolved()
    plan = [(4096, 1024, 1, 10), (32 << 20, 8 << 20, 1, 3)]
    # samples[backend][size][rank] = batch averages (seconds) over 3 repetitions
    shm = [[[1e-4, 3e-4, 2e-4]] * 3 + [[5e-4, 4e-4, 9e-4]],  # rank 3 is slowest: median 5e-4
           [[0.02, 0.02, 0.02]] * 4]
    gloo = [[[1e-3, 1e-3, 1e-3]] * 4, [[0.04, 0.05, 0.03]] * 4]
    # CPU seconds per op, the same shape: cpu_us is the mean over ranks of each rank's median
    shm_cpu = [[[4e-5, 6e-5, 5e-5]] * 2 + [[1e-4, 1e-4, 1e-4], [3e-4, 1e-4, 2e-4]], [[0.01, 0.03, 0.02]] * 4]
    rows = table_rows(cfg, plan, {"hetobs-shm": shm, "gloo": gloo}, 10.0, "float", {"hetobs-shm": shm_cpu})
    by = {(r.backend, r.size): r for r in rows}
    r = by[("hetobs-shm", 4096)]
    assert r.cpu_us == pytest.approx((50 + 50 + 100 + 200) / 4)
    assert by[("hetobs-shm", 32 << 20)].cpu_us == pytest.approx(20000.0)
    assert by[("gloo", 4096)].cpu_us is None  # not reported
    assert r.time_us == pytest.approx(500.0)
    assert r.rank_time_us == pytest.approx([200.0, 200.0, 200.0, 500.0])
    assert r.algbw == pytest.approx(4096 / 5e-4 / 1e9)
    assert r.busbw == pytest.approx(r.algbw * 1.5)
    assert r.busbw_vs_gloo == pytest.approx(r.busbw / by[("gloo", 4096)].busbw)
    assert r.busbw_vs_gloo == pytest.approx(1e-3 / 5e-4)
    assert r.busbw_of_memcpy is None  # below 16 MiB
    big = by[("hetobs-shm", 32 << 20)]
    assert big.busbw == pytest.approx((32 << 20) / 0.02 / 1e9 * 1.5)
    assert big.busbw_of_memcpy == pytest.approx(big.busbw / 10.0)
    assert by[("gloo", 32 << 20)].time_us == pytest.approx(40000.0)
    assert by[("gloo", 32 << 20)].busbw_vs_gloo is None
    assert (r.type, r.redop, r.root, r.count, r.reps) == ("float", "sum", -1, 1024, 3)


def test_copy_probe_measures_memcpy_and_the_kernels_copy() -> None:
    """Both copies of a cache-resident buffer, timed: positive rates, and the kernel's (the same
    system call a peer's read makes, here of this process) no faster than a few memcpys."""
    rates = measure_copies(64 << 10, repeats=5)
    assert rates.nbytes == 64 << 10 and rates.memcpy_gbs > 0
    assert rates.kernel_gbs is not None and rates.kernel_gbs > 0
    assert rates.kernel_of_memcpy == pytest.approx(rates.kernel_gbs / rates.memcpy_gbs)
    assert 0 < rates.kernel_of_memcpy < 4


def test_config_validation() -> None:
    for bad in (dict(op="barrier"), dict(ranks=0), dict(backends=("nccl",)), dict(dtype="complex64"),
                dict(reps=0), dict(sizes=(0,))):
        with pytest.raises(ValueError):
            BenchConfig(**bad).resolved()  # type: ignore[arg-type]
    q = BenchConfig(quick=True).resolved()
    assert q.sizes == QUICK_SIZES and q.reps == 3
    d = BenchConfig().resolved()
    assert d.sizes == DEFAULT_SIZES and d.reps == 5


# -- running it ----------------------------------------------------------------------------

def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, COLUMNS="200"))


def _check_rows(rows: list[dict[str, Any]], backend: str, n: int, sizes: list[int]) -> None:
    assert [r["backend"] for r in rows] == [backend] * len(sizes)
    assert [r["size"] for r in rows] == sizes
    for r in rows:
        assert r["op"] == "all_reduce" and r["ranks"] == n and r["type"] == "float" and r["redop"] == "sum"
        assert r["count"] * 4 == r["size"]
        for key in ("time_us", "algbw", "busbw", "memcpy_gbs"):
            assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw"] == pytest.approx(r["algbw"] * bus_factor("all_reduce", n))
        assert len(r["rank_time_us"]) == n and max(r["rank_time_us"]) == pytest.approx(r["time_us"])
        assert r["reps"] >= 1 and r["iters"] >= 1 and r["warmup"] >= 1
        # CPU per op: positive, and no more than the op's wall time on every core this rank may use
        assert 0 < r["cpu_us"] <= r["time_us"] * len(os.sched_getaffinity(0)) * 1.1, r
        assert r["busbw_of_memcpy"] is None  # sizes below 16 MiB
        assert 0 < r["kernel_copy_of_memcpy"] < 4, r  # a process may always read itself


def test_cli_bench_hetobs_shm_json(core: Any) -> None:
    p = _cli("--ranks", "2", "--sizes", "8,4K", "--reps", "1", "--json", "--backends", "hetobs-shm")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    _check_rows(rows, "hetobs-shm", 2, [8, 4096])
    assert all(r["busbw_vs_gloo"] is None for r in rows)  # no Gloo in this run


@needs_torch
def test_cli_bench_gloo_json_and_table() -> None:
    p = _cli("--ranks", "2", "--sizes", "8,4K", "--reps", "1", "--json", "--backends", "gloo")
    assert p.returncode == 0, p.stderr
    _check_rows(json.loads(p.stdout), "gloo", 2, [8, 4096])
    p = _cli("--ranks", "2", "--sizes", "4K", "--reps", "1", "--backends", "gloo")
    assert p.returncode == 0, p.stderr
    for column in ("size (B)", "count", "type", "time (us)", "cpu (us)", "algbw (GB/s)", "busbw (GB/s)"):
        assert column in p.stdout
    assert "4096" in p.stdout and "memcpy" in p.stdout
    assert "# copies in cache (256 KiB): memcpy" in p.stdout and "of memcpy" in p.stdout, p.stdout


@needs_torch
@pytest.mark.slow
def test_cli_bench_overhead_scraped_and_native_json_and_table(core: Any) -> None:
    """Every variant the rows name ran as named (the job checks its wrapper) and was watched."""
    p = _cli("overhead", "--ranks", "2", "--variants", "hetobs_gloo_scraped,hetobs", "--rounds", "2", "--steps",
             "4", "--json", timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [(r["variant"], r["ranks"]) for r in rows] == [("gloo", 2), ("hetobs_gloo_scraped", 2), ("hetobs", 2)]
    for r in rows:
        assert r["step_ms"] > 0 and r["cpu_ms"] > 0 and len(r["rounds_ms"]) == 2
        assert (r["overhead"] is None) == (r["variant"] == "gloo")
    scraped = rows[1]
    assert scraped["scrapes"] >= 2  # at least one during each of its batches
    assert scraped["overhead"] == pytest.approx(scraped["step_ms"] / rows[0]["step_ms"] - 1)
    p = _cli("overhead", "--ranks", "2", "--variants", "hetobs_gloo", "--rounds", "1", "--steps", "2", timeout=600)
    assert p.returncode == 0, p.stderr
    for column in ("variant", "step (ms)", "overhead", "CPU/step (ms)", "load average"):
        assert column in p.stdout
    assert "hetobs_gloo" in p.stdout
    bad = _cli("overhead", "--ranks", "2,x")
    assert bad.returncode == 2 and "--ranks" in bad.stderr
    bad = _cli("overhead", "--variants", "hetobs_mpi")
    assert bad.returncode == 2 and "unknown variant" in bad.stderr


def test_cli_bench_usage_errors() -> None:
    for args in (["--sizes", "3X"], ["--backends", "nccl"], ["--op", "barrier"], ["--ranks", "0"],
                 ["--bind", "socket"]):
        p = _cli(*args, timeout=60)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert p.stdout == "" and args[0] in p.stderr, (args, p.stderr)


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_gloo_every_op_with_uneven_ranks(op: str) -> None:
    """Three ranks: blocked ops round the count to a multiple of 3; each result is verified
    once by the worker (a wrong result would fail the backend)."""
    res = run_bench(BenchConfig(ranks=3, op=op, backends=("gloo",), sizes=(8, 1000), reps=1, quick=True,
                                memcpy_bytes=0))
    assert not res.failures, res.failures
    assert [r.size for r in res.rows] == [element_count(op, s, 3, 4) * 4 for s in (8, 1000)]
    for r in res.rows:
        assert r.time_us > 0 and r.busbw == pytest.approx(r.algbw * bus_factor(op, 3))
        assert r.root == (0 if op == "broadcast" else -1)
    assert res.memcpy_gbs is None


@needs_torch
def test_timed_out_backend_is_stopped_and_reported() -> None:
    """A batch over the timeout fails that backend with a message; its ranks are gone."""
    res = run_bench(BenchConfig(ranks=2, backends=("gloo",), sizes=(64 << 20,), reps=1, quick=True,
                                timeout_s=0.05, memcpy_bytes=0))
    assert set(res.failures) == {"gloo"} and "no reply" in res.failures["gloo"]
    assert res.rows == []
    for ready in res.info["gloo"]["ready"]:
        with pytest.raises(ProcessLookupError):
            os.kill(ready["pid"], 0)


# -- Open MPI as a peer --------------------------------------------------------------------

needs_ompi = pytest.mark.skipif(not (shutil.which("mpirun") and importlib.util.find_spec("mpi4py")),
                                reason="no Open MPI peer: mpirun (openmpi-bin) or mpi4py missing")


def _gone(pids: list[int]) -> bool:
    """Every pid exited (a zombie not yet reaped by init counts: it runs no more)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state not in ("Z", "X"):
            return False
    return True


@needs_ompi
@pytest.mark.slow
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_ompi_interleaved_with_hetobs(core: Any, op: str) -> None:
    """Open MPI (mpirun + mpi4py) runs in the same run at the same sizes as hetobs; each result is
    verified once by its worker; hetobs rows carry the ratio to Open MPI's busbw."""
    res = run_bench(BenchConfig(ranks=2, op=op, backends=("hetobs-shm", "ompi"), sizes=(8, 4096), reps=2,
                                quick=True, memcpy_bytes=0))
    assert not res.failures and not res.skipped, (res.failures, res.skipped)
    by = {(r.backend, r.size): r for r in res.rows}
    sizes = [element_count(op, s, 2, 4) * 4 for s in (8, 4096)]
    assert sorted(by) == sorted((b, s) for b in ("hetobs-shm", "ompi") for s in sizes)
    for s in sizes:
        m, h = by[("ompi", s)], by[("hetobs-shm", s)]
        assert m.time_us > 0 and m.busbw == pytest.approx(m.algbw * bus_factor(op, 2)) and m.reps == 2
        assert m.busbw_vs_ompi is None
        assert h.busbw_vs_ompi == pytest.approx(h.busbw / m.busbw)
    ready = res.info["ompi"]["ready"]
    assert [x["rank"] for x in ready] == [0, 1] and [x["size"] for x in ready] == [2, 2]
    assert "Open MPI" in res.info["ompi"]["exit"][0]["mpi"]
    assert _gone([x["pid"] for x in ready])


@needs_ompi
@pytest.mark.slow
def test_ompi_four_ranks_cli_table() -> None:
    """4 ranks on 2 cores (mpirun needs --oversubscribe, added by the runner); the table has the ratio column."""
    p = _cli("--ranks", "4", "--sizes", "4K", "--reps", "1", "--backends", "ompi,hetobs-shm", "--quick")
    assert p.returncode == 0, p.stderr
    assert "busbw/ompi" in p.stdout and "hetobs-shm/ompi" in p.stdout, p.stdout


@needs_ompi
def test_bind_core_places_every_backend_alike(core: Any) -> None:
    """--bind core: rank r of every backend (Open MPI's too, its own binding off) runs on the
    (r mod k)-th CPU of the k the bench may use, as its ranks report; rows say how they were placed."""
    cpus = sorted(os.sched_getaffinity(0))
    res = run_bench(BenchConfig(ranks=3, backends=("hetobs-shm", "ompi"), sizes=(8,), reps=1, quick=True,
                                memcpy_bytes=0, bind="core"))
    assert not res.failures and not res.skipped, (res.failures, res.skipped)
    for b in ("hetobs-shm", "ompi"):
        ready = sorted(res.info[b]["ready"], key=lambda x: int(x["rank"]))
        assert [x["cpus"] for x in ready] == [[cpus[r % len(cpus)]] for r in range(3)], (b, ready)
    assert {r.bind for r in res.rows} == {"core"} and len(res.rows) == 2
    assert {r.cpu_model for r in res.rows} == {cpu_model()} and cpu_model()
    unbound = run_bench(BenchConfig(ranks=2, backends=("hetobs-shm",), sizes=(8,), reps=1, quick=True,
                                    memcpy_bytes=0))
    assert [x["cpus"] for x in unbound.info["hetobs-shm"]["ready"]] == [cpus, cpus]  # none: left alone
    assert unbound.rows[0].bind == "none"
    with pytest.raises(ValueError, match="bind='socket'"):
        BenchConfig(bind="socket").resolved()


@needs_ompi
def test_timed_out_ompi_is_stopped_and_reported() -> None:
    """A batch over the timeout fails Open MPI with a message; mpirun and its ranks are gone."""
    res = run_bench(BenchConfig(ranks=2, backends=("ompi",), sizes=(64 << 20,), reps=1, quick=True,
                                timeout_s=0.05, memcpy_bytes=0))
    assert set(res.failures) == {"ompi"} and "no reply" in res.failures["ompi"]
    assert res.rows == []
    assert _gone([x["pid"] for x in res.info["ompi"]["ready"]])


@pytest.mark.slow
def test_forced_algorithm_variants(core: Any) -> None:
    """hetobs-shm-direct / -ring force all_reduce's algorithm at every size (HETOBS_SMALL_BYTES), so the
    crossover is measured in one run (the default takes cma above direct's sizes); the ranks' records
    say which algorithm really ran."""
    res = run_bench(BenchConfig(ranks=2, backends=("hetobs-shm", "hetobs-shm-direct", "hetobs-shm-ring"),
                                sizes=(4096, 1 << 20), reps=1, quick=True, memcpy_bytes=0))
    assert not res.failures, res.failures
    want = {"hetobs-shm": {"4096": ["direct"], str(1 << 20): ["cma"]},
            "hetobs-shm-direct": {"4096": ["direct"], str(1 << 20): ["direct"]},
            "hetobs-shm-ring": {"4096": ["ring"], str(1 << 20): ["ring"]}}
    for backend, by_bytes in want.items():
        for bye in res.info[backend]["exit"]:
            assert bye["algorithms_by_bytes"] == by_bytes, (backend, bye)
