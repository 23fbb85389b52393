"""Slurm: srun's variables alone start a job (hetobs.init, the torch backends, hetobs run).

No Slurm here: each rank gets the variables srun sets for its task (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID, SLURM_NODEID, the job and step ids, the node lists) and nothing else of a
launcher's: no RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT, no HETOBS_JOB_ID.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from _inline import InlineJob
from hetobs.config import SettingError, expand_hostlist, export_launch_env, from_env, launch_from_env

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HETOBS_JOB_ID", "GROUP_RANK",
                 "TORCHELASTIC_RUN_ID")


def srun_env(job: str, step: int, rank: int, ntasks: int, nodes: str, node: int, local: int) -> dict[str, str]:
    """What srun puts in the environment of task `rank` of step `step` of job `job`."""
    return {
        "SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step),
        "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
        "SLURM_STEP_NODELIST": nodes, "SLURM_JOB_NODELIST": nodes, "SLURM_NODELIST": nodes,
        "SLURM_NNODES": str(len(list(expand_hostlist(nodes)))), "SLURM_CPUS_ON_NODE": "2",
    }


def batch_env(job: str, nodes: str, ntasks: int) -> dict[str, str]:
    """What a batch script (or an salloc shell) sees: the allocation, no step."""
    return {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_PROCID": "0", "SLURM_NTASKS": str(ntasks),
            "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": nodes, "SLURM_NODELIST": nodes}


@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("gpu1", ["gpu1"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[098-101]x", ["n098x", "n099x", "n100x", "n101x"]),
    ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
    ("a,b[2-3],c", ["a", "b2", "b3", "c"]),
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
])
def test_host_lists_expand_as_slurm_writes_them(text: str, hosts: list[str]) -> None:
    assert list(expand_hostlist(text)) == hosts


@pytest.mark.parametrize("text", ["node[01-", "node]1", "n[a-b]", "n[3-1]", "n[[1]]", "n[]", "a b", "n1,bad["])
def test_malformed_host_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        list(expand_hostlist(text))


def test_srun_tasks_know_their_place_and_agree_on_the_rendezvous() -> None:
    launches = [launch_from_env(srun_env("4242", 3, r, 6, "node[01-03]", r // 2, r % 2)) for r in range(6)]
    assert [(x.source, x.rank, x.world_size, x.local_rank, x.node_rank) for x in launches] == [
        ("slurm", r, 6, r % 2, r // 2) for r in range(6)]
    assert {x.master_addr for x in launches} == {"node01"}  # rank 0 runs on the step's first host
    assert len({x.master_port for x in launches}) == 1
    other_step = launch_from_env(srun_env("4242", 4, 0, 6, "node[01-03]", 0, 0))
    assert other_step.master_port != launches[0].master_port  # two steps at once: two rendezvous
    given = launch_from_env({**srun_env("4242", 3, 1, 6, "node[01-03]", 0, 1), "MASTER_ADDR": "head",
                             "MASTER_PORT": "29500"})
    assert (given.master_addr, given.master_port) == ("head", 29500)


def test_torchrun_variables_win_and_a_batch_script_is_no_rank() -> None:
    under_srun = {**srun_env("5", 0, 1, 2, "n[1-2]", 1, 0), "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert (launch_from_env(under_srun).source, launch_from_env(under_srun).rank) == ("env", 3)
    # sbatch's script sees SLURM_PROCID=0 and SLURM_NTASKS=4 but is none of the 4 tasks
    assert launch_from_env(batch_env("5", "n[1-4]", 4)).source == ""


def test_a_job_id_per_step_in_python_and_in_the_native_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetobs import _core

    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    cases = [(srun_env("991", 0, 0, 2, "n1", 0, 0), "991.0"), (srun_env("991", 1, 0, 2, "n1", 0, 0), "991.1"),
             (batch_env("991", "n1", 2), "991"), ({"SLURM_JOB_ID": "991", "SLURM_STEPID": "7"}, "991.7"),
             ({**srun_env("991", 2, 0, 2, "n1", 0, 0), "HETOBS_JOB_ID": "mine"}, "mine")]
    for env, want in cases:
        assert from_env(env).job_id == want
        with monkeypatch.context() as m:  # the interposers read the same id from the real environment
            for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID", "HETOBS_JOB_ID"):
                m.delenv(k, raising=False)
            for k, v in env.items():
                m.setenv(k, v)
            assert _core.native_job_id() == (want, False)


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(SettingError, match="SLURM_PROCID='x'"):
        launch_from_env({**srun_env("1", 0, 0, 2, "n1", 0, 0), "SLURM_PROCID": "x"})
    with pytest.raises(SettingError, match="SLURM_STEP_NODELIST='n\\[1-'"):
        launch_from_env({**srun_env("1", 0, 0, 2, "n1", 0, 0), "SLURM_STEP_NODELIST": "n[1-"})


def test_export_fills_only_what_is_unset() -> None:
    env = {**srun_env("12", 0, 1, 2, "h[7-8]", 1, 0), "MASTER_PORT": "1234"}
    export_launch_env(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
        "1", "2", "0", "h7", "1234")
    plain: dict[str, str] = {"PATH": "/bin"}
    export_launch_env(plain)
    assert plain == {"PATH": "/bin"}  # no launcher: nothing invented


def _slurm_job_with_free_port() -> str:
    """A job id whose derived rendezvous port (step 0) is free right now."""
    for _ in range(50):
        job = str(uuid.uuid4().int % 10**7)
        port = launch_from_env(srun_env(job, 0, 0, 2, "127.0.0.[1-2]", 0, 0)).master_port
        assert port is not None
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return job
    raise AssertionError("no free derived port in 50 tries")


NUMPY_BODY = """
import json, os, numpy as np, hetobs
from hetobs import _core
comm = hetobs.init()
x = np.full(4, comm.rank + 1.0, np.float32)
comm.all_reduce(x)
print(json.dumps({"rank": comm.rank, "size": comm.size, "sum": float(x[0]), "job": _core.runtime_info()["job"]}))
"""

TORCH_BODY = """
import json, os, hetobs, torch, torch.distributed as dist
from hetobs import _core
dist.init_process_group("hetobs")
t = torch.full((4,), dist.get_rank() + 1.0)
dist.all_reduce(t)
print(json.dumps({"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": float(t[0]),
                  "job": _core.runtime_info()["job"]}))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("body", ["numpy", "torch"])
def test_srun_variables_alone_start_a_job(tmp_path: Path, body: str) -> None:
    if body == "torch":
        pytest.importorskip("torch")
    job = _slurm_job_with_free_port()
    # Two nodes of one task each, both this machine's loopback (127.0.0.2 is loopback too).
    ranks = {r: srun_env(job, 0, r, 2, "127.0.0.[1-2]", r, 0) for r in range(2)}
    with InlineJob(NUMPY_BODY if body == "numpy" else TORCH_BODY, 2, tmp_path, rank_env=ranks,
                   unset=LAUNCHER_VARS) as j:
        runs = j.wait(90)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    said = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    assert [(s["rank"], s["size"], s["sum"], s["job"]) for s in said] == [(r, 2, 3.0, f"{job}.0") for r in range(2)]
    assert sorted(os.listdir(j.dir / f"{job}.0" / "ranks")) == ["rank-0.json", "rank-1.json"]


def _hetobs_run(tmp_path: Path, env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HETOBS_", "SLURM_")) and k not in LAUNCHER_VARS}
    return subprocess.run([sys.executable, "-m", "hetobs.cli", "run", "--dir", str(tmp_path / "h"), "--", *cmd],
                          env={**base, **env}, capture_output=True, text=True, timeout=60)


SHOW = ["sh", "-c", 'echo "$HETOBS_JOB_ID ${HETOBS_SECRET:+secret}"']


def test_hetobs_run_in_an_allocation_takes_one_id_per_launch(tmp_path: Path) -> None:
    env = batch_env("3131", "n[1-2]", 2)
    first, second = (_hetobs_run(tmp_path, env, *SHOW) for _ in range(2))
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    assert first.stdout.split() == ["3131", "secret"] and second.stdout.split() == ["3131.run1", "secret"]
    assert (tmp_path / "h" / "3131" / "secret").exists() and (tmp_path / "h" / "3131.run1" / "secret").exists()


def test_hetobs_run_as_one_task_of_a_step_makes_no_secret(tmp_path: Path) -> None:
    runs = [_hetobs_run(tmp_path, srun_env("3232", 5, r, 2, "n[1-2]", r, 0), *SHOW) for r in range(2)]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert [r.stdout.split() for r in runs] == [["3232.5"], ["3232.5"]]  # one id, no secret each could not share
    assert "one of 2 tasks" in runs[0].stderr and "one of 2 tasks" not in runs[1].stderr  # said once
    assert not (tmp_path / "h" / "3232.5").exists()
    given = _hetobs_run(tmp_path, {**srun_env("3232", 5, 0, 2, "n[1-2]", 0, 0), "HETOBS_SECRET": "s"}, *SHOW)
    assert given.stdout.split() == ["3232.5", "secret"]  # a given secret is kept
