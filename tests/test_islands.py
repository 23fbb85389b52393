"""hetobs_islands: one job across islands with different libraries inside (Gloo, hetobs's
native transport, and the stand-in accelerator "standin" with its own library sccl; NCCL
needs a GPU), real rank processes each.

Every op, dtype and reduction is checked against numpy inside each rank
(tests/islands_program.py), on islands of equal and unequal sizes whose ranks are not
contiguous, with host tensors sent as they are and through the staging copies the relay
uses for device memory. DDP trains what plain Gloo trains.

The stand-in accelerator (standin/, hetobs_standin) is NOT a real device: its memory is
host memory behind non-host addresses, its copies run on paced copy-engine threads, its
kernels run on the CPU, and sccl carries collectives over Gloo in host memory. What it
proves is that islands of a device outside torch's tree, with a library of its own,
cross through the device-generic relay exactly; not any vendor's speed or driver.
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
    # equal islands cut alike: the native all-reduce among counterparts (hierarchical.py)
    "2x2 gloo, counterparts": [("a", "gloo"), ("b", "gloo"), ("b", "gloo"), ("a", "gloo")],
    "2+3, both route shapes": [("a", "hetobs"), ("b", "gloo"), ("b", "gloo"), ("a", "hetobs"), ("b", "gloo")],
    # a device outside torch's tree with its own library (the stand-in accelerator and sccl)
    "2x2 gloo+standin": [("a", "gloo"), ("s", "sccl", "standin"), ("a", "gloo"), ("s", "sccl", "standin")],
    "2+1 standin": [("s", "sccl", "standin"), ("s", "sccl", "standin"), ("a", "gloo")],
    # equal islands cut alike, one of them on a device: no counterparts shortcut (both ends must agree)
    "1+1 standin+cpu": [("s", "sccl", "standin"), ("a", "gloo")],
    "1+3 standin": [("a", "gloo"), ("s", "sccl", "standin"), ("s", "sccl", "standin"), ("s", "sccl", "standin")],
    "3 islands cpu+standin+native": [("a", "gloo"), ("s", "sccl", "standin"), ("b", "hetobs"),
                                     ("s", "sccl", "standin")],
}


def rank_env_of(layout: list[tuple[str, ...]]) -> dict[int, dict[str, str]]:
    """HETOBS_ISLAND(_BACKEND, _DEVICE) of each rank from (island, backend[, device])."""
    out = {}
    for r, (isl, be, *dev) in enumerate(layout):
        out[r] = {"HETOBS_ISLAND": isl, "HETOBS_ISLAND_BACKEND": be}
        if dev:
            out[r]["HETOBS_ISLAND_DEVICE"] = dev[0]
    return out


def run_layout(layout: list[tuple[str, ...]], tmp: Path, env: dict[str, str] | None = None,
               transport: str = "shm") -> list[dict]:
    rank_env = rank_env_of(layout)
    env = {"HETOBS_RECORDS": "16384", **(env or {})}  # every op's record stays in the ring
    with InlineJob(BODY, len(layout), tmp, env=env, rank_env=rank_env, transport=transport) as job:
        runs = job.wait(240)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2500:] for r in runs]
    return [json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
            for r in runs]


def check(results: list[dict], layout: list[tuple[str, ...]], relay_from_host: bool = False) -> None:
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
        # Each op names the device its tensors live on and the library inside the rank's island;
        # the relay ops say which device they staged from.
        device = layout[rank][2] if len(layout[rank]) > 2 else "cpu"
        assert res["devices"] == [device], (rank, res["devices"])
        assert res["libraries"] == [layout[rank][1]], (rank, res["libraries"])
        # (cpu islands of equal size may cross by the counterparts' native all_reduce, no relay;
        # without the torch extension device tensors are staged in Python, the relay sees host memory)
        relayed = "cpu" if relay_from_host else device
        assert res["relay_devices"] == [relayed] or (device == "cpu" and res["relay_devices"] == []), \
            (rank, res["relay_devices"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_op_dtype_and_reduction_matches_numpy(name: str, tmp_path: Path) -> None:
    check(run_layout(LAYOUTS[name], tmp_path), LAYOUTS[name])


@pytest.mark.slow
def test_device_islands_without_the_torch_extension_stage_in_python_and_stay_exact(tmp_path: Path) -> None:
    # Where hetobs._torch_ext cannot load (a torch it was not built for), the vendor library is
    # wrapped in Python and device tensors cross through whole copies to the host: slower, exact.
    layout = LAYOUTS["2x2 gloo+standin"]
    check(run_layout(layout, tmp_path, {"TEST_WITHOUT_TORCH_EXT": "1"}), layout, relay_from_host=True)


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


REFUSE_BODY = ("import os, torch.distributed as dist, hetobs\n"
               "if os.environ.get('LOAD_STANDIN') == '1':\n"
               "    import hetobs_standin\n"
               "try:\n"
               "    dist.init_process_group('hetobs_islands')\n"
               "except ValueError as e:\n"
               "    print('ERROR', e, flush=True)\n"
               "    raise SystemExit(3)\n")
STANDIN = {"HETOBS_ISLAND": "s", "HETOBS_ISLAND_DEVICE": "standin", "LOAD_STANDIN": "1"}
CPU = {"HETOBS_ISLAND": "c", "HETOBS_ISLAND_BACKEND": "gloo"}


@pytest.mark.parametrize("rank1, error", [
    # a library that cannot carry the island's device
    ({**STANDIN, "HETOBS_ISLAND_BACKEND": "gloo"},
     "island 's': rank 1 cannot run backend gloo on standin: gloo carries cpu, cuda tensors, not standin"),
    ({**STANDIN, "HETOBS_ISLAND_BACKEND": "hetobs"},
     "island 's': rank 1 cannot run backend hetobs on standin: the native transport inside an island moves host"),
    # the island's device is missing on the rank (the vendor's plugin is not loaded there)
    ({**STANDIN, "LOAD_STANDIN": "0", "HETOBS_ISLAND_BACKEND": "sccl"},
     "island 's': rank 1 has no standin device available (backend sccl)"),
    # a library torch cannot use for an island's ranks
    ({**CPU, "HETOBS_ISLAND_BACKEND": "mpi"}, "island 'c': rank 1 cannot run backend mpi on cpu"),
], ids=["gloo-on-standin", "native-on-standin", "device-missing", "mpi"])
def test_an_unusable_island_is_refused_on_every_rank_before_anything_is_sent(rank1: dict, error: str,
                                                                              tmp_path: Path) -> None:
    with InlineJob(REFUSE_BODY, 2, tmp_path, rank_env={0: CPU, 1: rank1}) as job:
        runs = job.wait(60)
    assert runs[1].returncode == 3 and f"ERROR {error}" in runs[1].stdout, (runs[1].stdout, runs[1].stderr[-2000:])
    # The other rank reads the refusal from the store and fails at once with the same words.
    assert runs[0].returncode == 3 and f"rank 1 cannot join the islands: {error}" in runs[0].stdout, \
        (runs[0].stdout, runs[0].stderr[-2000:])
    assert not list((tmp_path / "hetobs").glob("*/ranks/*.json")), "no native transport may start"


def test_ranks_that_disagree_on_the_relay_settings_are_refused(tmp_path: Path) -> None:
    rank_env = {0: CPU, 1: {"HETOBS_ISLAND": "d", "HETOBS_ISLAND_BACKEND": "gloo", "HETOBS_RELAY_STAGE": "host"}}
    with InlineJob(REFUSE_BODY, 2, tmp_path, rank_env=rank_env) as job:
        runs = job.wait(60)
    error = "HETOBS_RELAY_STAGE / HETOBS_RELAY_PIPELINE differ: rank 1 has"
    assert f"ERROR {error}" in runs[0].stdout, (runs[0].stdout, runs[0].stderr[-2000:])
    assert f"ERROR {error}" in runs[1].stdout or runs[1].returncode != 0, runs[1]


def test_one_island_on_two_device_types_is_refused_naming_both(tmp_path: Path) -> None:
    # Each rank's own settings are usable; together they would put one island on two devices.
    rank_env = {0: {**STANDIN, "HETOBS_ISLAND_BACKEND": "sccl"},
                1: {"HETOBS_ISLAND": "s", "HETOBS_ISLAND_BACKEND": "gloo", "HETOBS_ISLAND_DEVICE": "cpu"}}
    with InlineJob(REFUSE_BODY, 2, tmp_path, rank_env=rank_env) as job:
        runs = job.wait(60)
    error = "island 's': rank 1 has backend 'gloo' on 'cpu', but rank 0 has 'sccl' on 'standin'"
    assert f"ERROR {error}" in runs[0].stdout, (runs[0].stdout, runs[0].stderr[-2000:])
    assert f"ERROR {error}" in runs[1].stdout or runs[1].returncode != 0, runs[1]


def torchrun(backend: str, tmp: Path, layout: str = "a:gloo,b:hetobs,a:gloo,b:hetobs") -> list[dict]:
    tmp.mkdir(parents=True)
    env = dict(os.environ, TORCH_BACKEND=backend, HETOBS_DIR=str(tmp / "hetobs"), OMP_NUM_THREADS="1",
               RESULT_DIR=str(tmp), ISLAND_LAYOUT=layout)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           str(DDP_PROGRAM)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp / f"rank-{r}.json").read_text()) for r in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["a:gloo,b:hetobs,a:gloo,b:hetobs", "a:gloo,s:sccl:standin,a:gloo,s:sccl:standin"],
                         ids=["gloo+hetobs", "gloo+standin"])
def test_ddp_on_islands_trains_what_gloo_trains(layout: str, tmp_path: Path) -> None:
    plain = torchrun("gloo", tmp_path / "gloo")
    ours = torchrun("hetobs_islands", tmp_path / "islands", layout)
    want = np.concatenate([np.asarray(p) for p in plain[0]["params"]])
    for rank, run in enumerate(ours):
        got = np.concatenate([np.asarray(p) for p in run["params"]])
        assert np.max(np.abs(got - want)) <= 1e-9, f"rank {rank}"
        ops = [op for op, *_ in run["records"]]
        assert ops.count("all_reduce") >= 5 and "broadcast" in ops, ops
        island, _, *device = layout.split(",")[rank].split(":")
        assert {state for _, state, _, _ in run["records"]} == {"completed"}
        assert {isl for _, _, isl, _ in run["records"]} == {island}
        assert {dev for _, _, _, dev in run["records"]} == {device[0] if device else "cpu"}


RS_BODY = """
import json, numpy as np, torch, torch.distributed as dist, hetobs
dist.init_process_group("hetobs_islands")
r, n = dist.get_rank(), dist.get_world_size()
OPS = {"sum": (dist.ReduceOp.SUM, np.sum), "prod": (dist.ReduceOp.PRODUCT, np.prod),
       "min": (dist.ReduceOp.MIN, np.min), "max": (dist.ReduceOp.MAX, np.max), "avg": (dist.ReduceOp.AVG, np.mean)}
def value(q, count):
    return ((np.arange(count) * 7 + q * 3) % 5 + 1).astype(np.float64)  # products of up to 5 of 1..5 stay exact
bad = []
for dt in (torch.float32, torch.int32, torch.float64):
    for name, (op, fold) in OPS.items():
        if name == "avg" and not dt.is_floating_point:
            continue
        for c in (1, 7, 1000):
            out = torch.empty(c, dtype=dt)
            dist.reduce_scatter_tensor(out, torch.from_numpy(value(r, n * c)).to(dt), op=op)
            want = fold(np.stack([value(q, n * c) for q in range(n)]), axis=0)[r * c:(r + 1) * c]
            want = torch.from_numpy(want).to(dt).to(torch.float64).numpy()
            if not np.array_equal(out.to(torch.float64).numpy(), want):
                bad.append(f"{dt} {name} {c}")
c = 1 << 16  # the traffic of one more reduce_scatter: its relay op's bytes (the larger direction)
dist.reduce_scatter_tensor(torch.empty(c), torch.ones(n * c))
last = [x for x in hetobs.records() if x["op"] == "relay"][-1]
print("RESULT " + json.dumps({"bad": bad, "relay_bytes": last["bytes"], "block_bytes": c * 4}), flush=True)
"""

# Per rank, what its relay op of a reduce_scatter carries (the larger direction), in blocks (the
# output size): an island's partial of a block crosses once, to the rank whose block it is. Reducing
# everything first carried 4 blocks in 2x2 and 3 / 6 blocks in 2+1.
RS_RELAY_BLOCKS = {"2x2 gloo+hetobs": [1, 1, 1, 1], "2+1": [1, 1, 2]}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RS_RELAY_BLOCKS))
def test_reduce_scatter_relays_only_each_island_s_partial_of_the_blocks_it_needs(name: str, tmp_path: Path) -> None:
    layout = LAYOUTS[name]
    rank_env = rank_env_of(layout)
    with InlineJob(RS_BODY, len(layout), tmp_path, rank_env=rank_env) as job:
        runs = job.wait(120)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2500:] for r in runs]
    results = [json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:]) for r in runs]
    for rank, res in enumerate(results):
        assert res["bad"] == [], (rank, res["bad"])
    assert [res["relay_bytes"] / res["block_bytes"] for res in results] == RS_RELAY_BLOCKS[name]
