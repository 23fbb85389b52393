"""The cost of watching, as a bound that only a regression crosses.

A smaller run of `hetobs bench overhead` (hetobs/bench/overhead.py; the full table and the
targets, 1% and 2%, are in docs/PERF.md): the DDP step on plain Gloo against "hetobs_gloo"
through the C++ wrapper and through the Python fallback, 2 ranks, interleaved rounds, CPU
per step and the best round's step time. The bound is 30%: outside what the noise of a
shared 2-core machine moved these in the runs here at load average 7-11 (CPU per step within
5%, the best round within 16%; a median of rounds once moved 30%), so the test fails on a
regression that costs a large part of a step (a lock, a sleep or a dump on the op path, a
wrapper that serialises ops), not on noise. The fallback's old inline wait (5 ms of a 48 ms
step) has a test of its own that times nothing
(test_torch_backends.py::test_an_async_op_returns_before_it_completes_and_its_record_ends_when_it_does).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

BOUND = 0.30


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_watching_a_ddp_step_costs_less_than_the_bound(core) -> None:
    from hetobs.bench.overhead import OverheadConfig, run_overhead

    result = run_overhead(OverheadConfig(world_sizes=(2,), variants=("gloo", "hetobs_gloo", "hetobs_gloo_py"),
                                         rounds=5, steps=15))
    rows = {r.variant: r for r in result.rows}
    assert set(rows) == {"gloo", "hetobs_gloo", "hetobs_gloo_py"}
    base = rows["gloo"]
    for name in ("hetobs_gloo", "hetobs_gloo_py"):
        r = rows[name]
        assert r.cpu_overhead is not None
        detail = (f"{name}: rounds {[round(x, 1) for x in r.rounds_ms]} ms vs gloo "
                  f"{[round(x, 1) for x in base.rounds_ms]}, CPU {r.cpu_ms:.1f} vs {base.cpu_ms:.1f} ms/step, "
                  f"load {result.loadavg}")
        # CPU per step: what watching adds to the ranks' work, steady under load. Wall time:
        # the best round of each (a median of rounds moved by 30% at load average 10 here,
        # the best round, least disturbed, much less); it shows lost overlap, CPU cannot.
        assert r.cpu_overhead < BOUND, detail
        assert min(r.rounds_ms) / min(base.rounds_ms) - 1 < BOUND, detail
