"""torch.distributed through hetobs: the native "hetobs" backend and the instrumented
Gloo wrapper give exactly what plain Gloo gives (4 real ranks each), and the wrapper
records what it saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _inline import InlineJob

pytest.importorskip("torch")

PROGRAM = Path(__file__).with_name("torch_program.py")
BODY = f"import runpy; runpy.run_path({str(PROGRAM)!r}, run_name='__main__')"


def run(backend: str, tmp_path: Path) -> list[tuple[dict, list[dict] | None]]:
    with InlineJob(BODY, 4, tmp_path / backend, env={"TORCH_BACKEND": backend}) as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    out = []
    for r in runs:
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("RESULT", "RECORDS")))
        out.append((json.loads(lines["RESULT"]), json.loads(lines["RECORDS"]) if "RECORDS" in lines else None))
    return out


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, list[dict] | None]]:
    return run("gloo", tmp_path_factory.mktemp("gloo"))


def test_native_backend_matches_gloo(gloo, tmp_path: Path) -> None:
    ours = run("hetobs", tmp_path)
    for rank, ((g, _), (h, recs)) in enumerate(zip(gloo, ours)):
        assert h == g, f"rank {rank}"
        assert recs and {r["backend"] for r in recs} == {"native"}


def test_gloo_wrapper_matches_gloo_and_records_every_op(gloo, tmp_path: Path) -> None:
    ours = run("hetobs_gloo", tmp_path)
    for rank, ((g, _), (h, recs)) in enumerate(zip(gloo, ours)):
        assert h == g, f"rank {rank}"
        wrapped = [r for r in recs if r["backend"] == "gloo"]
        ops = [r["op"] for r in wrapped]
        assert ops[:3] == ["all_reduce"] * 3 and "all_to_all" in ops and "barrier" in ops
        first = wrapped[0]
        assert (first["count"], first["bytes"], first["state"]) == (10, 40, "completed")
        assert first["busbw_gbps"] > 0
        big = [r for r in wrapped if r["count"] == 300000]
        assert big and big[0]["bytes"] == 1_200_000 and big[0]["busbw_gbps"] > 0
        assert all(r["state"] == "completed" for r in wrapped)
        group_ops = {r["comm_id"] for r in wrapped}
        assert len(group_ops) == (2 if rank in (0, 2) else 1)  # the world and new_group([0, 2])
