"""hetobs_islands: one job across islands with different libraries inside (Gloo and
hetobs's native transport here; NCCL needs a GPU), real rank processes each.

Every op, dtype and reduction is checked against numpy inside each rank
(tests/islands_program.py), on islands of equal and unequal sizes whose ranks are not
contiguous, with host tensors sent as they are and through the staging copies the relay
uses for device memory. DDP trains what plain Gloo trains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _inline import InlineJob

pytest.importorskip("torch")

PROGRAM = Path(__file__).with_name("islands_program.py")
DDP_PROGRAM = Path(__file__).with_name("islands_ddp_program.py")
BODY = f"import runpy; runpy.run_path({str(PROGRAM)!r}, run_name='__main__')"

LAYOUTS = {
    # islands need not be contiguous in rank order, nor equal, nor use one library
    "2x2 gloo+hetobs": [("a", "gloo"), ("b", "hetobs"), ("a", "gloo"), ("b", "hetobs")],
    "2+1": [("a", "gloo"), ("a", "gloo"), ("b", "hetobs")],
    "3 islands 2+1+1": [("a", "gloo"), ("b", "hetobs"), ("c", "gloo"), ("a", "gloo")],
    "2+3, both route shapes": [("a", "hetobs"), ("b", "gloo"), ("b", "gloo"), ("a", "hetobs"), ("b", "gloo")],
}


def run_layout(layout: list[tuple[str, str]], tmp: Path, env: dict[str, str] | None = None,
               transport: str = "shm") -> list[dict]:
    rank_env = {r: {"HETOBS_ISLAND": isl, "HETOBS_ISLAND_BACKEND": be} for r, (isl, be) in enumerate(layout)}
    env = {"HETOBS_RECORDS": "16384", **(env or {})}  # every op's record stays in the ring
    with InlineJob(BODY, len(layout), tmp, env=env, rank_env=rank_env, transport=transport) as job:
        runs = job.wait(240)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2500:] for r in runs]
    return [json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
            for r in runs]


def check(results: list[dict], layout: list[tuple[str, str]]) -> None:
    for rank, res in enumerate(results):
        assert res["failures"] == [], f"rank {rank}: {res['failures'][:5]}"
    # Results every rank holds are bit-identical across islands.
    assert len({res["digest"] for res in results}) == 1
    # One record per op, one (comm, seq) per collective on every rank of every island, each
    # record naming its rank's island and the time spent in the island's library.
    for rank, res in enumerate(results):
        issued = res["issued"]
        assert res["ops"] == issued["collective"] + issued["p2p"], (rank, res["ops"], issued)
        assert res["seqs"] == list(range(1, issued["collective"] + 1)), rank
        assert res["islands"] == [layout[rank][0]], (rank, res["islands"])
        assert res["states"] == ["completed"], (rank, res["states"])
        assert res["phased"] > issued["collective"] // 2, (rank, res["phased"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_op_dtype_and_reduction_matches_numpy(name: str, tmp_path: Path) -> None:
    check(run_layout(LAYOUTS[name], tmp_path), LAYOUTS[name])


@pytest.mark.slow
def test_staged_relay_over_tcp_gives_the_same_results(tmp_path: Path) -> None:
    # HETOBS_RELAY_STAGE=host: every chunk goes through a real copy into a staging slot
    # and out again (what device memory takes), over TCP, in small chunks.
    layout = LAYOUTS["2x2 gloo+hetobs"]
    check(run_layout(layout, tmp_path, {"HETOBS_RELAY_STAGE": "host", "HETOBS_RELAY_CHUNK_BYTES": "65536",
                                        "HETOBS_RELAY_SLOTS": "4"}, transport="tcp"), layout)


def test_a_rank_with_a_bad_island_name_fails_every_rank_at_once(tmp_path: Path) -> None:
    body = ("import torch.distributed as dist, hetobs\n"
            "try:\n"
            "    dist.init_process_group('hetobs_islands')\n"
            "except ValueError as e:\n"
            "    print('ERROR', e)\n")
    rank_env = {0: {"HETOBS_ISLAND": "a"}, 1: {"HETOBS_ISLAND": "no spaces allowed"}}
    with InlineJob(body, 2, tmp_path, rank_env=rank_env) as job:
        runs = job.wait(60)
    assert "HETOBS_ISLAND='no spaces allowed'" in runs[1].stdout, runs[1].stderr[-2000:]
    assert "rank 1 cannot join the islands" in runs[0].stdout, runs[0].stderr[-2000:]


def test_one_island_with_two_libraries_is_refused_naming_both_ranks(tmp_path: Path) -> None:
    body = ("import torch.distributed as dist, hetobs\n"
            "try:\n"
            "    dist.init_process_group('hetobs_islands')\n"
            "except ValueError as e:\n"
            "    print('ERROR', e)\n")
    rank_env = {0: {"HETOBS_ISLAND": "a", "HETOBS_ISLAND_BACKEND": "gloo"},
                1: {"HETOBS_ISLAND": "a", "HETOBS_ISLAND_BACKEND": "hetobs"}}
    with InlineJob(body, 2, tmp_path, rank_env=rank_env) as job:
        runs = job.wait(60)
    # Rank 0 hosts torch's store; once it has read both identities it refuses and exits, and
    # rank 1 either refuses alike or loses the store: neither waits.
    assert "island 'a': rank 1 has backend 'hetobs' on 'cpu', but rank 0 has 'gloo'" in runs[0].stdout, runs[0]
    assert "ERROR island 'a'" in runs[1].stdout or runs[1].returncode != 0, runs[1]


def torchrun(backend: str, tmp: Path) -> list[dict]:
    tmp.mkdir(parents=True)
    env = dict(os.environ, TORCH_BACKEND=backend, HETOBS_DIR=str(tmp / "hetobs"), OMP_NUM_THREADS="1",
               RESULT_DIR=str(tmp), ISLAND_LAYOUT="a:gloo,b:hetobs,a:gloo,b:hetobs")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           str(DDP_PROGRAM)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp / f"rank-{r}.json").read_text()) for r in range(4)]


@pytest.mark.slow
def test_ddp_on_islands_trains_what_gloo_trains(tmp_path: Path) -> None:
    plain = torchrun("gloo", tmp_path / "gloo")
    ours = torchrun("hetobs_islands", tmp_path / "islands")
    want = np.concatenate([np.asarray(p) for p in plain[0]["params"]])
    for rank, run in enumerate(ours):
        got = np.concatenate([np.asarray(p) for p in run["params"]])
        assert np.max(np.abs(got - want)) <= 1e-9, f"rank {rank}"
        ops = [op for op, state, island in run["records"]]
        assert ops.count("all_reduce") >= 5 and "broadcast" in ops, ops
        assert {state for _, state, _ in run["records"]} == {"completed"}
        assert {island for _, _, island in run["records"]} == {"ab"[rank % 2]}
