"""Balancing a mixed job: hetobs.plan's splits, its accounting, and `hetobs plan` on real jobs.

The jobs are two ranks of tests/plan_program.py with sleep-made compute (the ranks'
speeds: 10 and 5 ms per sample), one all_reduce per step, read from outside the way a
user would: `hetobs plan` on the live stats segments, on the dumps of a job that has
exited, `hetobs top --json` and the exporter's textfile. Step times are never asserted;
the plan is (it is exact under any load that leaves sleep overshoot below ~20%).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import random
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _inline import InlineJob  # noqa: E402

from hetobs.plan import OpTime, account, split, split_layers  # noqa: E402

PROGRAM = Path(__file__).with_name("plan_program.py")
BODY = f"import runpy; runpy.run_path({str(PROGRAM)!r}, run_name='__main__')"
SLOW, FAST = 0.010, 0.005  # seconds per sample of rank 0 and rank 1
STEPS = 12


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", *argv], capture_output=True, text=True,
                          timeout=timeout)


# --- pure functions --------------------------------------------------------------------

def _best_split(total: int, per: list[float], caps: list[int | None]) -> float:
    """Brute force: the least max(per_i * b_i) over every integer split."""
    best = float("inf")
    for b in itertools.product(*(range((c if c is not None else total) + 1) for c in caps)):
        if sum(b) == total:
            best = min(best, max(p * x for p, x in zip(per, b)))
    return best


def test_split_is_the_optimal_integer_split_and_respects_caps() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 3)
        per = [rng.choice([0.5, 1.0, 1.5, 2.0, 3.0, 3.3]) for _ in range(n)]
        caps = [rng.choice([None, rng.randint(0, 8)]) for _ in range(n)]
        total = rng.randint(0, min(12, sum(c if c is not None else 12 for c in caps)))
        got = split(total, per, caps)
        assert sum(got) == total and all(c is None or b <= c for b, c in zip(got, caps)), (total, per, caps, got)
        assert max((p * b for p, b in zip(per, got)), default=0) == pytest.approx(_best_split(total, per, caps))
    assert split(48, [2.0, 1.0]) == [16, 32]  # proportional to speed where it divides
    assert split(96, [3.0, 3.0, 1.0, 1.0]) == [12, 12, 36, 36]


@pytest.mark.parametrize("args, message", [
    ((10, [1.0, 0.0]), "seconds_per_sample[1] = 0.0: expected a positive finite number"),
    ((10, [1.0, 1.0], [3, 3]), "global_batch 10 exceeds the ranks' max_batch total 6"),
    ((-1, [1.0]), "global_batch = -1: expected a non-negative integer"),
    ((4, [1.0, 1.0], [1]), "max_batch has 1 entries for 2 ranks"),
])
def test_split_rejects_bad_input_naming_it(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError) as e:
        split(*args)
    assert str(e.value) == message


def test_split_layers_minimises_the_slowest_stage() -> None:
    rng = random.Random(3)
    for _ in range(100):
        layers = [rng.choice([1.0, 2.0, 3.0, 5.0]) for _ in range(rng.randint(1, 7))]
        stages = rng.randint(1, len(layers))
        speed = [rng.choice([1.0, 2.0, 3.0]) for _ in range(stages)]
        got = split_layers(layers, stages, speed)
        assert sum(got.layers) == len(layers) and min(got.layers) >= 1
        best = float("inf")
        for cuts in itertools.combinations(range(1, len(layers)), stages - 1):
            bounds = [0, *cuts, len(layers)]
            best = min(best, max(sum(layers[a:b]) / s for a, b, s in zip(bounds, bounds[1:], speed)))
        assert got.bottleneck_seconds == pytest.approx(best)
    # a stage 3x faster takes (about) 3x the layers
    assert split_layers([1.0] * 8, 2, [3.0, 1.0]).layers == [6, 2]
    with pytest.raises(ValueError, match="stages = 4: expected an integer from 1 to the number of layers"):
        split_layers([1.0, 1.0], 4)


def test_account_separates_compute_waiting_and_transfer() -> None:
    ms = 1_000_000
    # rank 0 computes 8 ms and arrives last; rank 1 computes 4 ms and waits 4 ms; the op itself takes 1 ms.
    ops = {0: [OpTime(s, (9 * s + 8) * ms, (9 * s + 9) * ms) for s in range(1, 6)],
           1: [OpTime(s, (9 * s + 4) * ms, (9 * s + 9) * ms) for s in range(1, 6)]}
    ops[1].append(OpTime(7, 100 * ms, 101 * ms))  # seq 6 missing on both: only the newest run counts
    ops[0].append(OpTime(7, 100 * ms, 101 * ms))
    w = account(ops)
    assert w is None  # the newest common run (seq 7 alone) has no interval
    del ops[0][-1], ops[1][-1]
    w = account(ops)
    assert w is not None and (w.first_seq, w.last_seq, w.intervals) == (1, 5, 4)
    assert (w.ranks[0].compute_ns, w.ranks[0].wait_ns, w.ranks[0].inside_ns) == (4 * 8 * ms, 0, 4 * ms)
    assert (w.ranks[1].compute_ns, w.ranks[1].wait_ns, w.ranks[1].transfer_ns) == (4 * 4 * ms, 4 * 4 * ms, 4 * ms)
    assert w.collective_ns == 4 * ms
    assert w.ranks[0].busy_share == pytest.approx(8 / 9) and w.ranks[1].busy_share == pytest.approx(4 / 9)


# --- real jobs ---------------------------------------------------------------------------

class Held:
    """A running InlineJob whose ranks finished their steps and wait at FIFOs until release()."""

    def __init__(self, job: InlineJob, fifos: Path) -> None:
        self.job, self.fifos = job, fifos

    def wait_ready(self, world: int, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        for r in range(world):
            fd = os.open(self.fifos / f"ready-{r}", os.O_RDONLY | os.O_NONBLOCK)
            try:
                got = b""
                while b"ready" not in got:
                    left = end - time.monotonic()
                    assert left > 0 and all(p.poll() is None for p in self.job.procs), self._why(f"rank {r} not ready")
                    if select.select([fd], [], [], min(left, 0.5))[0]:
                        got += os.read(fd, 64)
            finally:
                os.close(fd)

    def release(self, world: int, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        for r in range(world):
            while True:
                try:
                    fd = os.open(self.fifos / f"go-{r}", os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError as e:  # ENXIO: the rank has not opened its end yet
                    assert e.errno == errno.ENXIO and time.monotonic() < end, self._why(f"rank {r} never waited")
                    select.select([], [], [], 0.01)
            os.write(fd, b"go\n")
            os.close(fd)

    def _why(self, what: str) -> str:
        self.job.kill()
        return what + "\n" + "\n".join(r.stderr[-2000:] for r in self.job.wait(5))


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Any]:
    jobs: list[InlineJob] = []

    def start(world: int, rank_env: dict[int, dict[str, str]], env: dict[str, str]) -> Held:
        fifos = tmp_path / "fifos"
        fifos.mkdir(exist_ok=True)
        for r in range(world):
            for name in (f"ready-{r}", f"go-{r}"):
                os.mkfifo(fifos / name)
        job = InlineJob(BODY, world, tmp_path, env={"PLAN_FIFO_DIR": str(fifos), "PLAN_STEPS": str(STEPS), **env},
                        rank_env=rank_env)
        jobs.append(job)
        return Held(job, fifos)

    try:
        yield start
    finally:
        for job in jobs:
            job.kill()


def _finish(h: Held, world: int = 2) -> None:
    h.release(world)
    runs = h.job.wait(60)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]


def test_plan_of_a_live_job_uses_the_reported_batches_and_evens_the_step(held: Any) -> None:
    # rank 0: 6 samples at 10 ms, rank 1: 10 at 5 ms (reported). Even for 16 samples would be
    # 8 + 8; equal time is 16 * (1/10) / (1/10 + 1/5) = 5.33 on rank 0: 5 and 11.
    h = held(2, {0: {"PLAN_PER_SAMPLE": str(SLOW), "PLAN_BATCH": "6"},
                 1: {"PLAN_PER_SAMPLE": str(FAST), "PLAN_BATCH": "10"}},
             {"PLAN_BACKEND": "native", "PLAN_REPORT": "1"})
    h.wait_ready(2)
    try:
        p = _cli("plan", "--job", h.job.job_id, "--global-batch", "16", "--dir", str(h.job.dir), "--json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["source"] == "live" and doc["batch_reported"] == [0, 1]
        assert [(e["rank"], e["island"], e["batch"], e["current_batch"]) for e in doc["plan"]] == \
            [(0, "rank0", 5, 6), (1, "rank1", 11, 10)]
        assert [e["seconds_per_sample"] for e in doc["plan"]] == pytest.approx([SLOW, FAST], rel=0.2)
        assert doc["window"]["intervals"] >= STEPS
        # the fast rank waits; the model says the even split loses a third, the plan almost nothing
        assert doc["eta_mix_even"] < 0.75 < 0.9 < doc["eta_mix_planned"] <= 1.0, doc
        fast, slow = doc["ranks"][1], doc["ranks"][0]
        assert fast["wait_s"] > 5 * slow["wait_s"] and fast["busy_share"] < slow["busy_share"] - 0.05
        human = _cli("plan", "--job", h.job.job_id, "--global-batch", "16", "--dir", str(h.job.dir))
        assert human.returncode == 0 and "eta_mix planned" in human.stdout, human.stderr
        # the same busy share in `hetobs top` and the exporter (from each rank's own records)
        top = _cli("top", "--job", h.job.job_id, "--dir", str(h.job.dir), "--json", "--interval", "0.05")
        assert top.returncode == 0, top.stderr
        shares = {r["rank"]: r["busy_share"] for r in json.loads(top.stdout)["ranks"]}
        assert shares == pytest.approx({0: slow["busy_share"], 1: fast["busy_share"]}, abs=0.02)
        text = h.job.dir / "metrics.prom"
        exp = _cli("exporter", "--job", h.job.job_id, "--dir", str(h.job.dir), "--textfile", str(text))
        assert exp.returncode == 0, exp.stderr
        lines = [ln for ln in text.read_text().splitlines() if ln.startswith("hetobs_rank_busy_share{")]
        assert len(lines) == 2 and all('island=""' in ln for ln in lines), lines
        got = {int(ln.split('rank="')[1].split('"')[0]): float(ln.rsplit(" ", 1)[1]) for ln in lines}
        assert got == pytest.approx({0: slow["busy_share"], 1: fast["busy_share"]}, abs=0.02)
    finally:
        _finish(h)


def test_plan_of_an_exited_job_reads_its_dumps_with_the_even_split_assumed(held: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    h = held(2, {0: {"PLAN_PER_SAMPLE": str(SLOW)}, 1: {"PLAN_PER_SAMPLE": str(FAST)}},
             {"PLAN_BACKEND": "hetobs_gloo", "PLAN_BATCH": "8"})
    h.wait_ready(2)
    try:
        d = _cli("dump", "--job", h.job.job_id, "--dir", str(h.job.dir))
        assert d.returncode == 0, d.stderr
    finally:
        _finish(h)
    # a stray report file is untrusted input: noted, and its rank's batch taken as even
    (h.job.dir / h.job.job_id / "plan").mkdir(parents=True)
    (h.job.dir / h.job.job_id / "plan" / "rank-1.json").write_text("{not json")
    p = _cli("plan", "--job", h.job.job_id, "--global-batch", "16", "--dir", str(h.job.dir), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["source"] == "dumps" and doc["incident"] and doc["batch_reported"] == []
    assert [(e["batch"], e["current_batch"]) for e in doc["plan"]] == [(5, 8), (11, 8)]
    assert len(doc["notes"]) == 1 and "rank-1.json: unreadable" in doc["notes"][0]
    live = _cli("plan", "--job", h.job.job_id, "--global-batch", "16", "--dir", str(h.job.dir), "--from", "live")
    assert live.returncode == 3 and live.stderr.count("\n") == 1 and "stats segments of 0" in live.stderr


def test_plan_of_an_islands_job_names_the_islands(held: Any) -> None:
    pytest.importorskip("torch")
    h = held(2, {0: {"PLAN_PER_SAMPLE": str(SLOW), "HETOBS_ISLAND": "slow", "HETOBS_ISLAND_BACKEND": "gloo"},
                 1: {"PLAN_PER_SAMPLE": str(FAST), "HETOBS_ISLAND": "fast", "HETOBS_ISLAND_BACKEND": "gloo"}},
             {"PLAN_BACKEND": "hetobs_islands", "PLAN_BATCH": "8"})
    h.wait_ready(2)
    try:
        p = _cli("plan", "--job", h.job.job_id, "--global-batch", "16", "--dir", str(h.job.dir), "--json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert [(e["island"], e["batch"]) for e in doc["plan"]] == [("slow", 5), ("fast", 11)]
        assert [a["island"] for a in doc["islands"]] == ["slow", "fast"]
        slow, fast = doc["islands"]
        assert fast["wait_s_per_step"] > 5 * slow["wait_s_per_step"] and fast["busy_share"] < slow["busy_share"]
    finally:
        _finish(h)


def test_plan_without_a_job_is_one_line_and_exit_3(tmp_path: Path) -> None:
    p = _cli("plan", "--job", "nosuchjob", "--global-batch", "8", "--dir", str(tmp_path))
    assert p.returncode == 3 and p.stderr.count("\n") == 1 and "nosuchjob" in p.stderr, p.stderr
