"""libhetobs_mpi.so under real Open MPI: records, counters, dumps, hangs, clean exits, mpi4py.

The C programs in tests/mpi/ are compiled with mpicc into the test's tmp dir and run with
`mpirun -np 4` and the library in LD_PRELOAD (passed to the ranks with -x, as `hetobs
run` does). Skipped only when mpicc/mpirun are absent; a missing library with MPI
present fails (the build should have made it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hetobs import jobs, stats
from hetobs.bench.mpi_shm import MpiShmDir
from hetobs.diagnosis.membership import members_of

TESTS = Path(__file__).resolve().parent
SOURCES = TESTS / "mpi"
NP = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (shutil.which("mpicc") and shutil.which("mpirun")),
                       reason="no MPI: mpicc/mpirun not on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)"),
]

# tests/mpi/collectives.c on MPI_COMM_WORLD with 4 ranks: calls and bytes per op kind.
# Gather/scatter are their own kinds once the core knows them, else recorded as all_gather/all_to_all.
_GATHER = "gather" if "gather" in stats.OP_KINDS else "all_gather"
_SCATTER = "scatter" if "scatter" in stats.OP_KINDS else "all_to_all"


def _expected_world() -> dict[str, tuple[int, int]]:
    n = NP
    calls: dict[str, list[int]] = {}

    def add(op: str, nbytes: int) -> None:
        c = calls.setdefault(op, [0, 0])
        c[0] += 1
        c[1] += nbytes

    for _ in range(3):
        add("all_reduce", 1024 * 4)          # MPI_Allreduce float x 1024
    for _ in range(2):
        add("broadcast", 100 * 4)            # MPI_Bcast int x 100
    add("reduce", 10 * 8)                    # MPI_Reduce double x 10
    add("all_gather", 5 * 4 * n)             # MPI_Allgather int x 5 per rank
    add("all_gather", sum(range(1, n + 1)) * 4)  # MPI_Allgatherv, rank r gives r+1 ints
    add("reduce_scatter", 3 * n * 8)         # MPI_Reduce_scatter_block double x 3 per rank
    add("reduce_scatter", sum(range(1, n + 1)) * 8)  # MPI_Reduce_scatter long, r+1 each
    add("all_to_all", 2 * n * 4)             # MPI_Alltoall int x 2 per peer
    add("all_to_all", n * 1)                 # MPI_Alltoallv 1 byte per peer (bytes this rank sends)
    add("barrier", 0)
    add("barrier", 0)
    add(_GATHER, 4 * n * 4)                  # MPI_Gather int x 4 per rank
    add(_SCATTER, 4 * n * 4)                 # MPI_Scatter int x 4 per rank
    add("send", 16 * 4)                      # MPI_Send
    add("recv", 16 * 4)                      # MPI_Recv
    add("send", 16 * 4)                      # MPI_Sendrecv: a send ...
    add("recv", 16 * 4)                      # ... and a recv
    add("recv", 8 * 8)                       # MPI_Irecv (Waitall)
    add("send", 8 * 8)                       # MPI_Isend (Waitall)
    for _ in range(2):
        add("recv", 4)                       # 2 x MPI_Irecv int x 1 ...
    for _ in range(2):
        add("send", 4)                       # ... 2 x MPI_Isend int x 1, one Waitall for the four
    add("all_reduce", 4 * 8)                 # MPI_Iallreduce long x 4 (Wait)
    add("broadcast", 32)                     # MPI_Ibcast byte x 32 (Test)
    return {k: (v[0], v[1]) for k, v in calls.items()}


EXPECTED_WORLD = _expected_world()
EXPECTED_WORLD_COLLECTIVES = sum(c for op, (c, _) in EXPECTED_WORLD.items() if op not in ("send", "recv"))


@pytest.fixture(scope="module")
def mpi_lib() -> str:
    from hetobs.preload import library_path

    try:
        return library_path("mpi")
    except FileNotFoundError as e:
        pytest.fail(f"MPI is installed but the interposer is not: {e}")


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("mpi-bin")
    built = {}
    for name in ("collectives", "hang", "threads", "topologies"):
        exe = out / name
        subprocess.run(["mpicc", "-O1", "-pthread", "-o", str(exe), str(SOURCES / f"{name}.c")], check=True,
                       timeout=120)
        built[name] = exe
    return built


class MpiRun:
    """One `mpirun` under the preload; killed (whole process group) and cleaned up by close()."""

    def __init__(self, tmp: Path, lib: str | None, argv: Sequence[str], *, np: int = NP,
                 env: dict[str, str] | None = None, job: str | None = None) -> None:
        self.job = job or f"mpi{uuid.uuid4().hex[:10]}"
        self.dir = tmp / "hetobs"
        self.secret = uuid.uuid4().hex
        self.log = tmp / f"{self.job}.log"
        settings = {"HETOBS_JOB_ID": self.job, "HETOBS_DIR": str(self.dir), "HETOBS_SECRET": self.secret,
                    "HETOBS_HANG_TIMEOUT": "300", **(env or {})}
        self.shm = MpiShmDir()
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np), *self.shm.mca_args()]
        if lib:
            cmd += ["-x", f"LD_PRELOAD={lib}"]
        for k, v in settings.items():
            cmd += ["-x", f"{k}={v}"]
        cmd += [str(a) for a in argv]
        penv = {k: v for k, v in os.environ.items() if not k.startswith("HETOBS_") and k != "LD_PRELOAD"}
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=penv,
                                         start_new_session=True, cwd=tmp)
        self.job_dir = Path(jobs.job_path(str(self.dir), self.job))

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.close()
            pytest.fail(f"mpirun did not finish in {timeout} s; output:\n{self.output()[-4000:]}")

    def wait_for(self, what: str, cond: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                pytest.fail(f"mpirun exited ({self.proc.returncode}) while waiting for {what}:\n"
                            f"{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}; output:\n{self.output()[-4000:]}")
            time.sleep(0.05)

    def segments(self) -> list[str]:
        return stats.segment_paths(self.job)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self.shm.remove()
        # Ranks killed before MPI_Finalize leave their stats segments behind.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            left = self.segments()
            for p in left:
                try:
                    gone = stats.read_segment(p).stale
                except stats.StatsError:
                    gone = True
                if gone:
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
            if not self.segments():
                break
            time.sleep(0.1)


@pytest.fixture
def mpirun(tmp_path: Path) -> Iterator[Any]:
    runs: list[MpiRun] = []

    def start(lib: str | None, argv: Sequence[str], **kw: Any) -> MpiRun:
        r = MpiRun(tmp_path, lib, argv, **kw)
        runs.append(r)
        return r

    try:
        yield start
    finally:
        for r in runs:
            r.close()


def _diagnose(run: MpiRun) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", run.job, "--dir", str(run.dir),
                        "--json"], check=False, capture_output=True, text=True, timeout=60)
    assert p.stdout.strip(), f"diagnose printed nothing (exit {p.returncode}): {p.stderr}"
    return p.returncode, json.loads(p.stdout)


def _rank_files(run: MpiRun) -> dict[int, dict[str, Any]]:
    ranks = jobs.read_ranks(str(run.job_dir))
    bad = {r: rf.problem for r, rf in ranks.items() if rf.data is None}
    assert not bad, bad
    return {r: rf.data for r, rf in ranks.items() if rf.data is not None}


def _start_held(mpirun: Any, lib: str, program: Path, tmp_path: Path) -> tuple[MpiRun, Path]:
    """Run `program SYNC_DIR` and wait until every rank is done with its ops and holds before
    MPI_Finalize (tests/mpi/test_support.h); touching SYNC_DIR/go lets them finish."""
    sync = tmp_path / "sync"
    sync.mkdir()
    run = mpirun(lib, [program, sync])
    run.wait_for("every rank to finish its ops", lambda: all((sync / f"ready-{r}").exists() for r in range(NP)))
    return run, sync


def test_collectives_records_counters_and_dump(programs: dict[str, Path], mpi_lib: str, mpirun: Any,
                                               tmp_path: Path) -> None:
    run, sync = _start_held(mpirun, mpi_lib, programs["collectives"], tmp_path)

    # Rank metadata: written at start, one per rank, the world communicator backed by MPI.
    meta = _rank_files(run)
    assert sorted(meta) == list(range(NP))
    for r, m in meta.items():
        assert m["rank"] == r and m["world_size"] == NP and m["job"] == run.job
        assert m["exited_cleanly"] is False
        assert m["side_channel"]["port"] > 0
        wm = [c for c in m["comms"] if c["comm_id"] == 0]
        assert wm and wm[0]["backend"] == "mpi" and members_of(run.job_dir, wm[0]).members == tuple(range(NP))
        split = [c for c in m["comms"] if c["comm_id"] != 0 and c["size"] == 2]
        assert len(split) == 1
        assert members_of(run.job_dir, split[0]).members == tuple(g for g in range(NP) if g % 2 == r % 2)

    # Live counters from each rank's stats segment equal the calls the program made.
    segs = run.segments()
    assert len(segs) == NP, segs
    split_ids = set()
    for path in segs:
        st = stats.read_segment(path, records=200)
        assert st.job == run.job and st.world_size == NP and not st.stale
        by_id = {c.comm_id: c for c in st.comms}
        world = by_id[0]
        got = {op: (k.calls, k.bytes) for op, k in world.ops.items() if k.calls}
        assert got == EXPECTED_WORLD, f"rank {st.rank}"
        assert all(k.errors == 0 for k in world.ops.values())
        assert world.coll_seq == EXPECTED_WORLD_COLLECTIVES
        assert world.inflight_op is None
        split = [c for c in st.comms if c.comm_id != 0 and c.size == 2]
        dup = [c for c in st.comms if c.comm_id != 0 and c.size == NP]
        assert len(split) == 1 and len(dup) == 1, st.comms
        assert split[0].ops["all_reduce"].calls == 2 and split[0].ops["all_reduce"].bytes == 8
        assert dup[0].ops["barrier"].calls == 1
        split_ids.add(split[0].comm_id)
        recs = [r for r in st.records if r["comm_id"] == 0]
        assert all(r["state"] == "completed" for r in recs)
        coll = [r for r in recs if r["collective_seq_id"]]
        assert [r["collective_seq_id"] for r in coll] == list(range(1, EXPECTED_WORLD_COLLECTIVES + 1))
        first = coll[0]
        assert (first["op"], first["dtype"], first["count"], first["bytes"]) == ("all_reduce", "float32", 1024, 4096)
    # Members of one split agree on its id; the two halves differ.
    assert len(split_ids) == 2

    # An on-demand dump of the live job: every rank answers over its side channel.
    res = jobs.request_dump(str(run.job_dir), secret=run.secret, timeout=20)
    assert res.answered == list(range(NP)) and not res.missing, res
    for r, path in res.files.items():
        d = json.loads(Path(path).read_text())
        assert d["schema"] == "hetobs.dump" and d["rank"] == r and d["reason"] == "on_demand"
        assert d["python"]["status"] == "unavailable"
        world_entries = [e for e in d["entries"] if e["comm_id"] == 0]
        assert world_entries and all(e["backend"] == "mpi" for e in d["entries"])
        counts: dict[str, int] = {}
        for e in world_entries:
            counts[e["op"]] = counts.get(e["op"], 0) + 1
        assert counts == {op: c for op, (c, _) in EXPECTED_WORLD.items()}, f"rank {r}"
        ar = [e for e in world_entries if e["op"] == "all_reduce"]
        assert ar[0]["dtype"] == "float32" and ar[0]["count"] == 1024 and ar[0]["bytes"] == 4096
        assert ar[0]["reduction"] == "sum" and ar[0]["state"] == "completed"
        bc = [e for e in world_entries if e["op"] == "broadcast"]
        assert bc[0]["root"] == 0 and bc[0]["dtype"] == "int32"
        sends = [e for e in world_entries if e["op"] == "send"]
        assert sends[0]["peer"] == (r + 1) % NP and sends[0]["p2p_seq_id"] >= 1
        world_state = next(c for c in d["comms"] if c["comm_id"] == 0)
        assert world_state["last_coll_seq"] == EXPECTED_WORLD_COLLECTIVES and world_state["in_flight"] is None

    # Let the ranks finish: MPI_Finalize marks each one as exited cleanly.
    (sync / "go").touch()
    assert run.wait() == 0, run.output()
    meta = _rank_files(run)
    assert all(m["exited_cleanly"] is True for m in meta.values()), meta
    assert run.segments() == []


# tests/mpi/topologies.c: each constructor's communicator carries one op kind.
TOPOLOGY_COMMS = {  # op kind and calls -> communicator size
    ("broadcast", 1): 4,  # Cart_create 1-D
    ("reduce", 1): 4,  # Cart_create 2 x 2
    ("all_reduce", 2): 2,  # Cart_sub rows of it
    ("barrier", 1): 4,  # Comm_dup_with_info
    ("all_to_all", 1): 4,  # Graph_create
    ("all_gather", 1): 4,  # Dist_graph_create_adjacent
    (_GATHER, 1): 4,  # Dist_graph_create
    (_SCATTER, 1): 4,  # Intercomm_merge
    ("reduce_scatter", 1): 4,  # Comm_idup (watched once its request completes)
}


def test_topology_communicators_are_watched(programs: dict[str, Path], mpi_lib: str, mpirun: Any,
                                            tmp_path: Path) -> None:
    run, sync = _start_held(mpirun, mpi_lib, programs["topologies"], tmp_path)
    ids: dict[tuple[str, int], set[int]] = {}
    for path in run.segments():
        st = stats.read_segment(path, records=50)
        seen = {}
        for c in st.comms:
            used = [(op, k.calls) for op, k in c.ops.items() if k.calls]
            if c.comm_id == 0 or not used:  # the world; the split for Intercomm_create; a dup with no op
                continue
            assert len(used) == 1, (st.rank, c.comm_id, used)
            seen[used[0]] = c.size
            ids.setdefault(used[0], set()).add(c.comm_id)
        assert seen == TOPOLOGY_COMMS, f"rank {st.rank}"
    # Every member derives the same id; the two rows of the grid differ.
    assert {k: len(v) for k, v in ids.items()} == {k: 2 if k == ("all_reduce", 2) else 1 for k in TOPOLOGY_COMMS}
    # Size 2: the grid's row (Cart_sub) and the parity split that feeds Intercomm_create.
    pairs = {r: sorted(list(members_of(run.job_dir, c).members) for c in m["comms"] if c["size"] == 2)
             for r, m in _rank_files(run).items()}
    assert pairs == {0: [[0, 1], [0, 2]], 1: [[0, 1], [1, 3]], 2: [[0, 2], [2, 3]], 3: [[1, 3], [2, 3]]}, pairs
    (sync / "go").touch()
    assert run.wait() == 0, run.output()


def test_hang_dumps_every_rank_into_one_incident(programs: dict[str, Path], mpi_lib: str, mpirun: Any) -> None:
    sleeper = 2
    run = mpirun(mpi_lib, [programs["hang"], sleeper, 8], env={"HETOBS_HANG_TIMEOUT": "1"})
    inc = run.job_dir / "incidents" / "hang-c0-s3"
    run.wait_for("every rank's hang dump", lambda: all((inc / f"rank-{r}.json").exists() for r in range(NP)),
                 timeout=30)
    dumps = {r: json.loads((inc / f"rank-{r}.json").read_text()) for r in range(NP)}
    for r, d in dumps.items():
        assert d["incident"] == "hang-c0-s3"
        assert d["python"]["status"] == "unavailable"
        world = next(c for c in d["comms"] if c["comm_id"] == 0)
        if r == sleeper:
            assert d["reason"] == "peer_request"
            assert world["last_coll_seq"] == 2 and world["in_flight"] is None
        else:
            assert world["in_flight"]["op"] == "all_reduce" and world["in_flight"]["collective_seq_id"] == 3
            assert world["in_flight"]["waiting_on"] == []  # 2.1: MPI names no peer of a collective
        assert d["version"] == "2.1"
        if d["reason"] == "watchdog":  # the hang as data: what hung, who saw it; no peer to blame
            info = d["cause_info"]
            assert (info["kind"], info["culprits"], info["reporter"], info["op"], info["seq"]) == \
                ("hang", [], r, "all_reduce", 3), info
    assert any(d["reason"] == "watchdog" for d in dumps.values())

    code, report = _diagnose(run)
    assert code == 1 and report["status"] == "fault", report
    v = report["verdicts"][0]
    assert v["kind"] == "rank_not_joined" and v["ranks"] == [sleeper] and v["comm"] == 0 and v["seq"] == 3, v
    # The sleeper wakes, the allreduce completes and the job ends normally.
    assert run.wait() == 0, run.output()


def test_clean_run_is_healthy(programs: dict[str, Path], mpi_lib: str, mpirun: Any) -> None:
    run = mpirun(mpi_lib, [programs["collectives"]])
    assert run.wait() == 0, run.output()
    meta = _rank_files(run)
    assert sorted(meta) == list(range(NP))
    assert all(m["exited_cleanly"] is True and m["exit_time_ns"] for m in meta.values()), meta
    assert not (run.job_dir / "incidents").exists() or not os.listdir(run.job_dir / "incidents")
    assert run.segments() == []
    code, report = _diagnose(run)
    assert code == 0 and report["status"] == "healthy", report


MPI4PY_PROGRAM = r"""
import os, sys, time
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size()
x = np.full(256, rank + 1, dtype=np.float64)
y = np.empty_like(x)
for _ in range(2):
    comm.Allreduce(x, y, op=MPI.SUM)
assert y[0] == n * (n + 1) / 2, y[0]
b = np.arange(16, dtype=np.int32) if rank == 0 else np.zeros(16, dtype=np.int32)
comm.Bcast(b, root=0)
assert b[15] == 15
g = np.empty(3 * n, dtype=np.float32)
comm.Allgather(np.full(3, rank, dtype=np.float32), g)
assert g[-1] == n - 1
comm.Barrier()
req = comm.Iallreduce(np.ones(4, dtype=np.int64), z := np.empty(4, dtype=np.int64), op=MPI.SUM)
req.Wait()
assert z[0] == n
sync = sys.argv[1]
open(os.path.join(sync, f"ready-{rank}"), "w").close()
while not os.path.exists(os.path.join(sync, "go")):
    time.sleep(0.01)
"""


def test_mpi4py_under_the_preload(mpi_lib: str, mpirun: Any, tmp_path: Path) -> None:
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install -e '.[test]')")
    script = tmp_path / "mpi4py_prog.py"
    script.write_text(MPI4PY_PROGRAM)
    sync = tmp_path / "sync4py"
    sync.mkdir()
    run = mpirun(mpi_lib, [sys.executable, script, sync])
    run.wait_for("every mpi4py rank to finish its ops",
                 lambda: all((sync / f"ready-{r}").exists() for r in range(NP)), timeout=90)
    segs = run.segments()
    assert len(segs) == NP
    for path in segs:
        st = stats.read_segment(path)
        world = {c.comm_id: c for c in st.comms}[0]
        got = {op: (k.calls, k.bytes) for op, k in world.ops.items() if k.calls}
        assert got == {"all_reduce": (3, 2 * 256 * 8 + 4 * 8), "broadcast": (1, 16 * 4),
                       "all_gather": (1, 3 * NP * 4), "barrier": (1, 0)}, f"rank {st.rank}"
    (sync / "go").touch()
    assert run.wait() == 0, run.output()
    meta = _rank_files(run)
    assert sorted(meta) == list(range(NP)) and all(m["exited_cleanly"] for m in meta.values())


def test_inert_outside_mpi_and_in_the_launcher(mpi_lib: str, tmp_path: Path) -> None:
    """Loaded into processes that never call MPI_Init (a plain program, mpirun itself), it does nothing."""
    hdir = tmp_path / "hetobs"
    env = {**os.environ, "LD_PRELOAD": mpi_lib, "HETOBS_DIR": str(hdir), "HETOBS_JOB_ID": "inert"}
    p = subprocess.run([sys.executable, "-c", "print('plain')"], env=env, capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0 and p.stdout == "plain\n" and p.stderr == ""
    p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "true"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    assert not hdir.exists()
    assert stats.segment_paths("inert") == []


def test_invalid_setting_leaves_the_job_running(programs: dict[str, Path], mpi_lib: str, mpirun: Any) -> None:
    run = mpirun(mpi_lib, [programs["collectives"]], np=2, env={"HETOBS_RECORDS": "many"})
    assert run.wait() == 0, run.output()
    lines = [ln for ln in run.output().splitlines() if "HETOBS_RECORDS" in ln]
    assert len(lines) == 2, run.output()  # one line per rank
    assert "HETOBS_RECORDS='many': expected a number" in lines[0] and "interposer is off" in lines[0]
    assert not run.job_dir.exists()
    assert run.segments() == []


def test_generated_job_id_is_agreed(programs: dict[str, Path], mpi_lib: str, mpirun: Any) -> None:
    """Without HETOBS_JOB_ID (or SLURM_JOB_ID, TORCHELASTIC_RUN_ID) rank 0's generated id is used by all."""
    run = mpirun(mpi_lib, [programs["collectives"]], np=2, env={"HETOBS_JOB_ID": ""})
    assert run.wait() == 0, run.output()
    made = os.listdir(run.dir)
    assert len(made) == 1, made
    ranks = jobs.read_ranks(str(run.dir / made[0]))
    assert sorted(ranks) == [0, 1]
    assert {rf.data["job"] for rf in ranks.values() if rf.data} == {made[0]}
    assert all(rf.data and rf.data["exited_cleanly"] for rf in ranks.values())



def test_concurrent_nonblocking_ops_from_threads(programs: dict[str, Path], mpi_lib: str, mpirun: Any,
                                                 tmp_path: Path) -> None:
    """MPI_THREAD_MULTIPLE: requests made and completed on two threads at once are each matched to their op."""
    iters = 200
    sync = tmp_path / "sync-threads"
    sync.mkdir()
    run = mpirun(mpi_lib, [programs["threads"], iters, sync])
    run.wait_for("every rank's threads to finish",
                 lambda: run.proc.poll() == 77 or all((sync / f"ready-{r}").exists() for r in range(NP)))
    if run.proc.poll() == 77:
        pytest.skip("this MPI does not provide MPI_THREAD_MULTIPLE")
    for path in run.segments():
        st = stats.read_segment(path, records=2048)
        dups = [c for c in st.comms if c.comm_id != 0]
        assert len(dups) == 2 and len({c.comm_id for c in dups}) == 2, st.comms
        for c in dups:
            got = {op: k.calls for op, k in c.ops.items() if k.calls}
            assert got == {"send": iters, "recv": iters, "all_reduce": iters}, f"rank {st.rank}"
            assert c.coll_seq == iters and c.p2p_seq == 2 * iters and c.inflight_op is None
        assert st.records and all(r["state"] == "completed" for r in st.records), f"rank {st.rank}"
    (sync / "go").touch()
    assert run.wait() == 0, run.output()


# The native reader (csrc/src/common/env_config.cc) must accept and refuse what hetobs.config does,
# with the same message. Singleton runs (no mpirun: MPI_Init makes a world of one) keep this quick.
_BAD = [("HETOBS_RECORDS", "many"), ("HETOBS_RECORDS", "0"), ("HETOBS_RECORDS", "1.5"),
        ("HETOBS_HANG_TIMEOUT", "0.01"), ("HETOBS_HANG_TIMEOUT", "abc"), ("HETOBS_TIMEOUT", "-1"),
        ("HETOBS_CONNECT_TIMEOUT", "0"), ("HETOBS_TRANSPORT", "udp"), ("HETOBS_WATCHDOG", "yes"),
        ("HETOBS_ABORT_ON_HANG", "2"), ("HETOBS_DUMP_SIGNAL", "SIGFOO"), ("HETOBS_DUMP_SIGNAL", "9"),
        ("HETOBS_DUMP_SIGNAL", " stop "), ("HETOBS_JOB_ID", "a/b"), ("HETOBS_JOB_ID", ".."),
        ("HETOBS_DEBUG", "loud"), ("HETOBS_SMALL_BYTES", "-1"), ("HETOBS_OTEL_SAMPLE", "x"),
        ("HETOBS_HANG_TIMEOUT", "nan"), ("HETOBS_TIMEOUT", "-inf"), ("HETOBS_RECORDS", "2000000000")]
_GOOD = [("HETOBS_RECORDS", " 64 "), ("HETOBS_RECORDS", "1_000"), ("HETOBS_HANG_TIMEOUT", "1e3"),
         ("HETOBS_DUMP_SIGNAL", "usr2"), ("HETOBS_DUMP_SIGNAL", "12"), ("HETOBS_WATCHDOG", " TRUE "),
         ("HETOBS_DEBUG", "error"), ("HETOBS_OTEL_SAMPLE", "5"), ("HETOBS_TRANSPORT", "TCP"),
         ("HETOBS_HANG_TIMEOUT", "inf"), ("HETOBS_TIMEOUT", "inf")]


def _singleton(programs: dict[str, Path], lib: str, tmp: Path, var: str, value: str) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETOBS_")}
    env.update({"LD_PRELOAD": lib, "HETOBS_DIR": str(tmp / "hetobs"), "HETOBS_JOB_ID": "single", var: value})
    p = subprocess.Popen([str(programs["hang"]), "-1", "0"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p, err


@pytest.mark.parametrize(("var", "value"), _BAD)
def test_settings_refused_like_python(programs: dict[str, Path], mpi_lib: str, tmp_path: Path, var: str,
                                      value: str) -> None:
    from hetobs.config import SettingError, from_env

    with pytest.raises(SettingError) as exc:
        from_env({var: value})
    p, err = _singleton(programs, mpi_lib, tmp_path, var, value)
    assert p.returncode == 0, err
    lines = [ln for ln in err.splitlines() if ln.startswith("hetobs:")]
    assert len(lines) == 1 and str(exc.value) in lines[0] and "interposer is off" in lines[0], (str(exc.value), err)
    assert not (tmp_path / "hetobs").exists()


@pytest.mark.parametrize(("var", "value"), _GOOD)
def test_settings_accepted_like_python(programs: dict[str, Path], mpi_lib: str, tmp_path: Path, var: str,
                                       value: str) -> None:
    from hetobs.config import from_env

    from_env({var: value})
    p, err = _singleton(programs, mpi_lib, tmp_path, var, value)
    assert p.returncode == 0, err
    assert "hetobs:" not in err, err
    meta = json.loads((tmp_path / "hetobs" / "single" / "ranks" / "rank-0.json").read_text())
    assert meta["exited_cleanly"] is True and meta["world_size"] == 1


def test_watchdog_off_means_inert(programs: dict[str, Path], mpi_lib: str, tmp_path: Path) -> None:
    """HETOBS_WATCHDOG=0 turns off dumps and the stats segment: the interposer has nothing to feed and stays out."""
    p, err = _singleton(programs, mpi_lib, tmp_path, "HETOBS_WATCHDOG", "0")
    assert p.returncode == 0 and "hetobs:" not in err, err
    assert not (tmp_path / "hetobs").exists()
    assert stats.segment_paths("single") == []


# A crawling mpi4py job (rank 1 computes 3x longer between collectives) judged live by
# `diagnose --window`: the interposer's records go through the same window rule.
MPI4PY_CRAWL = r"""
import os, sys, time
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
sync = sys.argv[1]
compute_s = 0.02 * (3 if rank == 1 else 1)
x, y = np.ones(4096, dtype=np.float32), np.empty(4096, dtype=np.float32)
i = 0
while True:  # killed by the test (MpiRun.close): only the data op, so every op judged is one the slow rank is late to
    if i == 3:
        open(os.path.join(sync, f"ready-{rank}"), "w").close()
    time.sleep(compute_s)  # stands for the step's compute, not for synchronization
    comm.Allreduce(x, y, op=MPI.SUM)
    i += 1
"""


def test_window_names_the_slow_rank_of_an_mpi_job_as_straggler(mpi_lib: str, mpirun: Any, tmp_path: Path) -> None:
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install -e '.[test]')")
    script = tmp_path / "mpi4py_crawl.py"
    script.write_text(MPI4PY_CRAWL)
    sync = tmp_path / "sync"
    sync.mkdir()
    run = mpirun(mpi_lib, [sys.executable, script, sync], np=3, env={"HETOBS_HANG_TIMEOUT": "30"})
    run.wait_for("every rank to run", lambda: all((sync / f"ready-{r}").exists() for r in range(3)), timeout=60)
    time.sleep(3)  # let a full window of ops happen (the window is what is judged)
    p = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", run.job, "--dir", str(run.dir),
                        "--window", "3", "--json"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HETOBS_SECRET": run.secret})
    run.close()
    assert p.stdout.strip(), p.stderr
    data = json.loads(p.stdout)
    assert str(data["incident"]).startswith("ondemand-"), data  # judged on a dump taken now
    assert p.returncode == 0 and data["status"] == "healthy", data
    assert [v["kind"] for v in data["verdicts"]] == ["straggler"], data["verdicts"]
    [v] = data["verdicts"]
    assert v["ranks"] == [1], v
    assert any("arrived last at" in e for e in v["evidence"]), v["evidence"]
