"""hetobs's clock (what records are stamped with) is CLOCK_MONOTONIC, even where it is read
through the TSC: within microseconds of time.monotonic_ns() across its once-a-second
re-anchoring, and never backwards, so times a caller passes in (ExternalComm.end(start=...,
end=...), the islands' phases) mix with the ones hetobs takes itself."""

from __future__ import annotations

import time
from typing import Any


def test_the_clock_reads_clock_monotonic(core: Any) -> None:
    tolerance = 200_000  # ns around the two Python reads: a call, or a preemption between them
    worst, reads, prev = 0, 0, core.clock_ns()
    end = time.monotonic_ns() + 2_500_000_000  # spans two re-anchorings
    while True:
        a = time.monotonic_ns()
        m = core.clock_ns()
        b = time.monotonic_ns()
        assert m >= prev, f"the clock went back by {prev - m} ns"
        prev = m
        worst = max(worst, a - m, m - b)
        reads += 1
        if b > end:
            break
    assert worst <= tolerance, f"{worst} ns outside the time.monotonic_ns() reads around it"
    assert reads > 1000
