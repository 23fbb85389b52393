"""The NCCL interposer (LD_PRELOAD) and NCCL profiler plugin in libhetobs_nccl.so.

This machine has no GPU and no NCCL, so tests/nccl/ builds stand-ins for them: a fake
libnccl.so.2 and a fake libcudart.so.12 (tiny C libraries defining the calls used). The
fake NCCL drives the profiler plugin through NCCL's documented plugin ABI the way
NCCL's network proxy does (proxy ops and steps, with their state transitions); the fake
CUDA events complete as soon as they are recorded unless the fake GPU is "stalled".
Everything else is real: the preload and symbol interposition, the runtime, the stats
segment read from another process, the watchdog and its hang dumps, the side channel
between the ranks, on-demand dumps and `hetobs diagnose`. What only a GPU can show
(real NCCL, real CUDA events) is left to tests/nccl/gpu_check.sh (docs/nccl.md).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hetobs.stats import read_segment
from hetobs.diagnosis.membership import members_of

NCCL_TESTS = Path(__file__).resolve().parent / "nccl"
REPO = Path(__file__).resolve().parent.parent

# The collectives nccl_app.c issues before its last phase: op, count, out_count, dtype.
APP_OPS = [
    ("all_reduce", 1024, 1024, "float32"),
    ("all_gather", 256, 512, "float32"),          # out_count = sendcount * 2 ranks (1 * 1 rank alone)
    ("reduce_scatter", 256, 128, "float32"),      # count = recvcount * 2 ranks
    ("broadcast", 512, 512, "int32"),
    ("reduce", 64, 64, "float64"),
    ("send", 32, 0, "float16"),
    ("recv", 0, 32, "float16"),
    ("all_reduce", 1 << 20, 1 << 20, "bfloat16"),
]
COLLECTIVES_BEFORE_STALL = 6   # of APP_OPS (send/recv are p2p)
STEPS, CHANNELS = 4, 2         # the fake NCCL's ring: per collective and channel, one op each way of 4 steps


def _library() -> Path:
    override = os.environ.get("HETOBS_NCCL_LIB")
    if override:
        return Path(override)
    from hetobs.preload import library_path

    try:
        return Path(library_path("nccl"))
    except FileNotFoundError as e:
        pytest.fail(f"libhetobs_nccl.so is not built/installed: {e}")


@pytest.fixture(scope="session")
def lib() -> Path:
    return _library()


@pytest.fixture(scope="session")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the stand-ins (fake libnccl/libcudart), the application and the plugin harness."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc) to build the NCCL/CUDA stand-ins in tests/nccl/")
    d = tmp_path_factory.mktemp("nccl-fakes")
    inc = f"-I{NCCL_TESTS}"

    def build(*args: str) -> None:
        subprocess.run([cc, "-O1", "-Wall", "-Wextra", *args], check=True, cwd=d)

    build("-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-o", "libcudart.so.12", str(NCCL_TESTS / "fake_cudart.c"))
    build("-shared", "-fPIC", inc, "-Wl,-soname,libnccl.so.2", "-o", "libnccl.so.2", str(NCCL_TESTS / "fake_nccl.c"),
          "-ldl", "-lpthread")
    (d / "libnccl.so").symlink_to("libnccl.so.2")
    (d / "libcudart.so").symlink_to("libcudart.so.12")
    build("-o", "nccl_app", str(NCCL_TESTS / "nccl_app.c"), "-L.", "-lnccl", "-lcudart", "-Wl,-rpath,$ORIGIN")
    build(inc, "-o", "profiler_harness", str(NCCL_TESTS / "profiler_harness.c"), "-ldl")
    # NCCL alone, without any CUDA runtime in reach (the interposer must stay inert).
    nocuda = d / "nocuda"
    nocuda.mkdir()
    build("-shared", "-fPIC", inc, "-Wl,-soname,libnccl.so.2", "-o", "nocuda/libnccl.so.2",
          str(NCCL_TESTS / "fake_nccl.c"), "-ldl", "-lpthread")
    (nocuda / "app.c").write_text(
        "typedef struct { char internal[128]; } ncclUniqueId;\n"
        "typedef struct ncclComm* ncclComm_t;\n"
        "int ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);\n"
        "int ncclAllReduce(const void*, void*, unsigned long, int, int, ncclComm_t, void*);\n"
        "int ncclCommDestroy(ncclComm_t);\n"
        "int main(void) { ncclUniqueId id = {{0}}; ncclComm_t c; char b[8];\n"
        "  if (ncclCommInitRank(&c, 1, id, 0)) return 1;\n"
        "  if (ncclAllReduce(b, b, 2, 7, 0, c, 0)) return 1;\n"
        "  return ncclCommDestroy(c); }\n")
    build("-o", "nocuda/app", "nocuda/app.c", "-Lnocuda", "-l:libnccl.so.2", "-Wl,-rpath,$ORIGIN")
    return d


class Proc:
    """One process of a test job: stdout read line by line with deadlines, killed at the end."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, start_new_session=True)
        self.lines: list[str] = []
        self._buf = b""

    def expect(self, word: str, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        assert self.p.stdout is not None
        while not any(line.startswith(word) for line in self.lines):
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {word!r} from {self.p.args} within {timeout}s; stdout {self.lines}, "
                                     f"stderr {self.stderr()}")
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if not r:
                continue
            chunk = os.read(self.p.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"{self.p.args} exited ({self.p.wait()}) before {word!r}; stdout {self.lines}, "
                                     f"stderr {self.stderr()}")
            self._buf += chunk
            *done, self._buf = self._buf.split(b"\n")
            self.lines += [x.decode(errors="replace") for x in done]

    def proceed(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(b"go\n")
        self.p.stdin.flush()

    def finish(self, timeout: float = 30.0) -> int:
        try:
            out, _ = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.lines += (self._buf + out).decode(errors="replace").splitlines()
        return self.p.returncode

    def stderr(self) -> str:
        if self.p.poll() is None or self.p.stderr is None:
            return "(running)"
        return self.p.stderr.read().decode(errors="replace")

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()


@pytest.fixture
def procs() -> Any:
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def job_env(tmp_path: Path, fakes: Path, lib: Path, job: str, rank: int, world: int, *, plugin: bool = True,
            **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETOBS_", "NCCL_", "FAKE_"))}
    env.update({
        "HETOBS_JOB_ID": job, "HETOBS_DIR": str(tmp_path / "jobs"), "HETOBS_HANG_TIMEOUT": "1",
        "HETOBS_CONNECT_TIMEOUT": "5", "RANK": str(rank), "WORLD_SIZE": str(world),
        "LD_PRELOAD": str(lib), "LD_LIBRARY_PATH": str(fakes),
    })
    if plugin:
        env["NCCL_PROFILER_PLUGIN"] = str(lib)  # a path is used as given
    env.update(extra)
    return env


def rank_file(tmp_path: Path, job: str, rank: int) -> dict[str, Any]:
    return json.loads((tmp_path / "jobs" / job / "ranks" / f"rank-{rank}.json").read_text())


def wait_for(pred: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def segment(tmp_path: Path, job: str, rank: int) -> Any:
    return read_segment(rank_file(tmp_path, job, rank)["stats_segment"], records=64)


def settled(seg: Any) -> bool:
    """Every ended record is also counted in the comm stats (end() writes the record first)."""
    ended = sum(r["state"] in ("completed", "failed") for r in seg.records)
    return ended == sum(k.calls for c in seg.comms for k in c.ops.values())


def dump_now(tmp_path: Path, job: str, rank: int) -> dict[str, Any]:
    """An on-demand dump through the rank's control socket (what `echo dump | socat` does)."""
    path = rank_file(tmp_path, job, rank)["control_socket"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"dump test\n")
        reply = s.recv(4096).decode()
    assert reply.startswith("ok "), reply
    return json.loads(Path(reply.split()[2]).read_text())


def nccl_comm(dump: dict[str, Any]) -> dict[str, Any]:
    comms = [c for c in dump["comms"] if c.get("backend") == "nccl"]
    assert len(comms) == 1, dump["comms"]
    return comms[0]


def peer_counts(p: dict[str, Any]) -> tuple[int, ...]:
    s, r = p["send"], p["recv"]
    return (s["posted"], s["sent"], s["acked"], s["done"], r["posted"], r["received"], r["done"])


def link_counts(link: Any) -> tuple[int, ...]:
    g = link.progress
    return (g["send_posted"], g["send_sent"], g["send_acked"], g["send_done"], g["recv_posted"], g["recv_received"],
            g["recv_done"])


# ---------------------------------------------------------------------------------------------- the library


def test_exports_only_nccl_entry_points_and_needs_neither_nccl_nor_cuda(lib: Path) -> None:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert names == {
        "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll", "ncclCommSplit", "ncclCommDestroy",
        "ncclCommAbort", "ncclGroupStart", "ncclGroupEnd", "ncclAllReduce", "ncclAllGather", "ncclReduceScatter",
        "ncclBroadcast", "ncclBcast", "ncclReduce", "ncclSend", "ncclRecv",
        "ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6",
    }
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "libnccl" not in needed and "libcudart" not in needed and "libcuda" not in needed


# ---------------------------------------------------------------------------------------------- the preload


def test_preload_records_every_op_with_names_counts_and_backend(tmp_path: Path, fakes: Path, lib: Path,
                                                                  procs: list[Proc]) -> None:
    job = f"nccl{uuid.uuid4().hex[:10]}"
    # Each op spends 20 ms inside the call (host), while the fake GPU's events say 1.5 ms.
    app = Proc([str(fakes / "nccl_app"), "0", "1", "stall"],
               job_env(tmp_path, fakes, lib, job, 0, 1, FAKE_NCCL_OP_US="20000", FAKE_CUDA_ELAPSED_MS="1.5"))
    procs.append(app)
    app.expect("STALLED")
    seg = wait_for(lambda: (s := segment(tmp_path, job, 0)) and len(s.records) == len(APP_OPS) + 1 and
                   all(r["state"] == "completed" for r in s.records[:-1]) and settled(s) and s,
                   what="the ops to complete")
    recs = seg.records
    single = [(op, c if op != "reduce_scatter" else c // 2, oc if op != "all_gather" else oc // 2, dt)
              for op, c, oc, dt in APP_OPS]  # one rank: gathered/scattered sizes are those of one rank
    assert [(r["op"], r["count"], r["out_count"], r["dtype"]) for r in recs[:-1]] == single
    assert [r["collective_seq_id"] for r in recs] == [1, 2, 3, 4, 5, 0, 0, 6, 7]
    assert [r["p2p_seq_id"] for r in recs] == [0, 0, 0, 0, 0, 1, 2, 0, 0]
    assert recs[0]["bytes"] == 4096 and recs[-2]["bytes"] == 2 << 20
    # Durations are the CUDA events' (cudaEventElapsedTime), not the host's view of the call.
    for r in recs[:-1]:
        duration_ms = (r["time_discovered_completed_ns"] - r["time_discovered_started_ns"]) / 1e6
        assert 1.5 <= duration_ms < 4.5, r
        assert (r["time_discovered_completed_ns"] - r["time_created_ns"]) / 1e6 >= 20, r
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (duration_ms * 1e6), rel=0.01)
    assert recs[-1]["op"] == "all_reduce" and recs[-1]["state"] == "started"
    (comm,) = seg.comms
    assert comm.size == 1 and comm.rank == 0 and comm.coll_seq == 7 and comm.p2p_seq == 2
    assert comm.inflight_op == "all_reduce" and comm.inflight_record == recs[-1]["record_id"]
    assert comm.ops["all_reduce"].calls == 2 and comm.ops["send"].calls == 1 and comm.ops["recv"].calls == 1

    d = dump_now(tmp_path, job, 0)
    assert d["python"]["status"] == "unavailable"
    entries = [e for e in d["entries"] if e["comm_id"] == comm.comm_id]
    assert {(e["backend"], e["device_type"]) for e in entries} == {("nccl", "cuda")}
    assert [e["profiling_name"] for e in entries][:2] == ["hetobs:all_reduce", "hetobs:all_gather"]
    c = nccl_comm(d)
    assert c["in_flight"]["op"] == "all_reduce" and c["in_flight"]["collective_seq_id"] == 7
    assert c["in_flight"]["peers"] == [] and c["links"] == []  # one rank: NCCL has no peers to proxy for

    app.proceed()
    assert app.finish() == 0, app.stderr()
    meta = rank_file(tmp_path, job, 0)
    assert meta["exited_cleanly"] is True
    assert not Path(meta["stats_segment"]).exists()  # removed at a clean exit


def test_two_ranks_proxy_progress_hang_dumps_and_link_diagnosis(tmp_path: Path, fakes: Path, lib: Path,
                                                                procs: list[Proc]) -> None:
    """Rank 0 hands 4 steps of the stuck allreduce to the network but only 2 complete, and
    rank 1 receives only 2 of them: the plugin's counters show it and the diagnosis blames
    the link 0 -> 1."""
    job = f"nccl{uuid.uuid4().hex[:10]}"
    stall = {0: ("4", "2", "4"), 1: ("4", "4", "2")}  # sent, acked, received on the stuck op
    apps = []
    for r in (0, 1):
        app = Proc([str(fakes / "nccl_app"), str(r), "2", "stall", *stall[r]], job_env(tmp_path, fakes, lib, job, r, 2))
        procs.append(app)
        apps.append(app)
    for app in apps:
        app.expect("STALLED")

    ops = COLLECTIVES_BEFORE_STALL * CHANNELS + 1  # proxy ops each way before the stall (+1: send, recv)
    before = (ops, ops * STEPS, ops * STEPS, ops, ops, ops * STEPS, ops)
    expect = {  # stuck op: one send and one recv op posted, none done
        0: (ops + 1, (ops + 1) * STEPS, ops * STEPS + 2, ops, ops + 1, (ops + 1) * STEPS, ops),
        1: (ops + 1, (ops + 1) * STEPS, (ops + 1) * STEPS, ops, ops + 1, ops * STEPS + 2, ops),
    }
    assert before[1] == 52
    for r in (0, 1):  # live, from outside the process: the stats segment's link slot
        (link,) = wait_for(lambda: segment(tmp_path, job, r).links, what=f"rank {r}'s link")
        assert (link.peer, link.global_peer, link.transport) == (1 - r, 1 - r, "net")
        assert link_counts(link) == expect[r]
        assert link.frames_sent == expect[r][1] and link.frames_recv == expect[r][5]

    # Both watchdogs fire (HETOBS_HANG_TIMEOUT=1) on the same op and dump into one incident.
    seg = segment(tmp_path, job, 0)
    (comm,) = seg.comms
    incident = tmp_path / "jobs" / job / "incidents" / f"hang-c{comm.comm_id}-s7"
    wait_for(lambda: all((incident / f"rank-{r}.json").exists() for r in (0, 1)), what=f"dumps in {incident}")
    for r in (0, 1):
        d = json.loads((incident / f"rank-{r}.json").read_text())
        assert d["reason"] in ("watchdog", "peer_request")
        c = nccl_comm(d)
        assert members_of(tmp_path / "jobs" / job, c).ring == (0, 1)
        f = c["in_flight"]
        assert (f["op"], f["collective_seq_id"], f["count"]) == ("all_reduce", 7, 4096)
        (p,) = f["peers"]
        assert (p["peer"], p["global_peer"], p["transport"]) == (1 - r, 1 - r, "net")
        assert peer_counts(p) == expect[r]
        assert p["seconds_since_change"] >= 0.9
        (lk,) = c["links"]
        assert lk["bytes_sent"] > 0 and lk["bytes_recv"] > 0
        assert {w["rank"] for w in f["waiting_on"]} <= {1 - r}, f["waiting_on"]  # 2.1: the wait as data
        if d["reason"] == "watchdog":
            assert {w["rank"] for w in f["waiting_on"]} == {1 - r}, f["waiting_on"]
            assert "waiting on rank" in d["cause"], d["cause"]
            info = d["cause_info"]
            assert (info["kind"], info["culprits"], info["reporter"], info["op"], info["seq"]) == \
                ("hang", [1 - r], r, "all_reduce", 7), info

    out = subprocess.run([sys.executable, "-m", "hetobs.cli", "diagnose", "--job", job, "--dir",
                          str(tmp_path / "jobs"), "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert report["status"] == "fault"
    kinds = {(v["kind"], tuple(map(tuple, v["links"]))) for v in report["verdicts"]}
    assert ("link_stalled", ((0, 1),)) in kinds, report

    for app in apps:
        app.proceed()
    for r, app in enumerate(apps):
        assert app.finish() == 0, app.stderr()
        assert rank_file(tmp_path, job, r)["exited_cleanly"] is True


def test_side_channel_reaches_the_other_rank(tmp_path: Path, fakes: Path, lib: Path, procs: list[Proc]) -> None:
    """The ranks find each other's side channel through their rank files: `hetobs dump --job`
    (peer to peer over it) gets a dump from both."""
    job = f"nccl{uuid.uuid4().hex[:10]}"
    apps = [Proc([str(fakes / "nccl_app"), str(r), "2", "stall"],
                 job_env(tmp_path, fakes, lib, job, r, 2, HETOBS_HANG_TIMEOUT="300")) for r in (0, 1)]
    procs.extend(apps)
    for app in apps:
        app.expect("STALLED")
    wait_for(lambda: all(rank_file(tmp_path, job, r)["side_channel"]["port"] for r in (0, 1)),
             what="both ranks to know both side channels")
    out = subprocess.run([sys.executable, "-m", "hetobs.cli", "dump", "--job", job, "--dir", str(tmp_path / "jobs"),
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (out.stdout, out.stderr)
    inc = tmp_path / "jobs" / job / "incidents"
    (one,) = [d for d in inc.iterdir() if d.name.startswith("ondemand-")]
    assert sorted(p.name for p in one.iterdir()) == ["rank-0.json", "rank-1.json"]
    for app in apps:
        app.proceed()
        assert app.finish() == 0


def test_rejected_captured_and_aborted_ops(tmp_path: Path, fakes: Path, lib: Path, procs: list[Proc]) -> None:
    """A call NCCL rejects is recorded failed with NCCL's message (the application still gets
    NCCL's result); an op captured into a CUDA graph is not recorded (it runs at graph
    launch); an op in flight when its communicator is aborted ends failed."""
    runs = {}
    for mode in ("error", "capture", "abort"):
        job = f"nccl{uuid.uuid4().hex[:10]}"
        app = Proc([str(fakes / "nccl_app"), "0", "1", mode],
                   job_env(tmp_path, fakes, lib, job, 0, 1, HETOBS_HANG_TIMEOUT="300", NCCL_APP_HOLD="1"))
        procs.append(app)
        if mode == "abort":
            app.expect("STALLED")
            app.proceed()
        app.expect("HOLD")
        seg = wait_for(lambda: (s := segment(tmp_path, job, 0)) and
                       all(r["state"] != "started" for r in s.records) and settled(s) and s,
                       what=f"{mode}: ops to end")
        app.proceed()
        assert app.finish() == 0, app.stderr()
        runs[mode] = (seg, rank_file(tmp_path, job, 0), app.lines)

    seg, meta, lines = runs["error"]
    assert "ERROR_RESULT 4" in lines  # ncclInvalidArgument, as the fake NCCL returned it
    last = seg.records[-1]
    assert (last["op"], last["state"], last["error"]) == ("all_reduce", "failed", "fake nccl error")
    (comm,) = seg.comms
    assert comm.failed and comm.ops["all_reduce"].errors == 1 and comm.ops["all_reduce"].calls == 3
    assert meta["exited_cleanly"] is True  # a rejected call is the application's business, not a crash

    seg, meta, _ = runs["capture"]
    assert len(seg.records) == len(APP_OPS)  # the captured allreduce left no record
    assert meta["exited_cleanly"] is True

    seg, meta, _ = runs["abort"]
    last = seg.records[-1]
    assert (last["op"], last["state"], last["error"]) == ("all_reduce", "failed", "communicator aborted")
    assert meta["exited_cleanly"] is False  # an op that ran failed


def test_async_error_fails_the_op_and_dumps_before_it_ends(tmp_path: Path, fakes: Path, lib: Path,
                                                           procs: list[Proc]) -> None:
    """NCCL reports an asynchronous error for the communicator (ncclCommGetAsyncError, as when a
    peer dies) while an op is in flight: the rank dumps an error incident showing that op, then
    the op ends failed with NCCL's message."""
    job = f"nccl{uuid.uuid4().hex[:10]}"
    app = Proc([str(fakes / "nccl_app"), "0", "1", "asyncerr"],
               job_env(tmp_path, fakes, lib, job, 0, 1, HETOBS_HANG_TIMEOUT="300", NCCL_APP_HOLD="1"))
    procs.append(app)
    app.expect("STALLED")
    seg = wait_for(lambda: (s := segment(tmp_path, job, 0)) and s.records[-1]["state"] == "failed" and
                   settled(s) and s, what="the op to fail")
    msg = "remote process exited or there was a network error (fake)"
    assert seg.records[-1]["error"] == msg and seg.comms[0].failed
    (inc,) = (tmp_path / "jobs" / job / "incidents").iterdir()
    assert inc.name == f"error-c{seg.comms[0].comm_id}-s7"
    d = json.loads((inc / "rank-0.json").read_text())
    assert d["reason"] == "error" and msg in d["cause"] and "all_reduce seq 7" in d["cause"]
    assert nccl_comm(d)["in_flight"]["collective_seq_id"] == 7
    app.proceed()
    app.expect("HOLD")
    app.proceed()
    assert app.finish() == 0
    assert rank_file(tmp_path, job, 0)["exited_cleanly"] is False


def test_nonblocking_communicator_ops_complete(tmp_path: Path, fakes: Path, lib: Path, procs: list[Proc]) -> None:
    """Calls answer ncclInProgress (a non-blocking communicator): the poller records each op's
    end event once ncclCommGetAsyncError stops saying ncclInProgress, and the ops complete."""
    job = f"nccl{uuid.uuid4().hex[:10]}"
    app = Proc([str(fakes / "nccl_app"), "0", "1", "ops"],
               job_env(tmp_path, fakes, lib, job, 0, 1, FAKE_NCCL_NONBLOCKING="1", NCCL_APP_HOLD="1"))
    procs.append(app)
    app.expect("HOLD")
    seg = wait_for(lambda: (s := segment(tmp_path, job, 0)) and len(s.records) == len(APP_OPS) and
                   all(r["state"] == "completed" for r in s.records) and s, what="in-progress ops to complete")
    assert [r["op"] for r in seg.records] == [op for op, *_ in APP_OPS]
    app.proceed()
    assert app.finish() == 0
    assert rank_file(tmp_path, job, 0)["exited_cleanly"] is True


@pytest.mark.parametrize("version", [4, 6])
def test_split_and_init_all_communicators(tmp_path: Path, fakes: Path, lib: Path, procs: list[Proc],
                                          version: int) -> None:
    """ncclCommSplit: the child gets an id both members derive alike, and the profiler binds
    the child's proxy progress to the child, not to its parent (v6: through the API event on
    the calling thread; v4, which has none: the one unclaimed comm of that rank and size).
    ncclCommInitAll: one id for the communicator whose ranks all live in this process, each
    rank with its own progress."""
    v = str(version)
    job = f"nccl{uuid.uuid4().hex[:10]}"
    apps = [Proc([str(fakes / "nccl_app"), str(r), "2", "split"],
                 job_env(tmp_path, fakes, lib, job, r, 2, NCCL_APP_HOLD="1", HETOBS_HANG_TIMEOUT="300",
                         FAKE_NCCL_PROFILER_VERSION=v))
            for r in (0, 1)]
    procs.extend(apps)
    segs = []
    for r, app in enumerate(apps):
        app.expect("HOLD")
        segs.append(wait_for(lambda: (s := segment(tmp_path, job, r)) and len(s.records) == len(APP_OPS) + 1 and
                             all(x["state"] == "completed" for x in s.records) and s, what="the child's op"))
    for r, seg in enumerate(segs):
        parent, child = seg.comms
        assert child.comm_id != parent.comm_id and (child.size, child.rank) == (2, r)
        assert seg.records[-1]["comm_id"] == child.comm_id and seg.records[-1]["count"] == 8
        by_comm = {lk.comm_id: lk for lk in seg.links}
        ops = COLLECTIVES_BEFORE_STALL * CHANNELS + 1
        assert link_counts(by_comm[parent.comm_id])[:4] == (ops, ops * STEPS, ops * STEPS, ops)
        assert link_counts(by_comm[child.comm_id]) == (2, 2 * STEPS, 2 * STEPS, 2, 2, 2 * STEPS, 2)
    assert segs[0].comms[1].comm_id == segs[1].comms[1].comm_id
    for app in apps:
        app.proceed()
        assert app.finish() == 0

    job = f"nccl{uuid.uuid4().hex[:10]}"
    app = Proc([str(fakes / "nccl_app"), "0", "2", "initall"],
               job_env(tmp_path, fakes, lib, job, 0, 1, NCCL_APP_HOLD="1", FAKE_NCCL_PROFILER_VERSION=v))
    procs.append(app)
    app.expect("HOLD")
    seg = wait_for(lambda: (s := segment(tmp_path, job, 0)) and len(s.records) == 2 and
                   all(x["state"] == "completed" for x in s.records) and s, what="the grouped ops")
    assert [(c.size, c.rank) for c in seg.comms] == [(2, 0), (2, 1)]
    assert seg.comms[0].comm_id == seg.comms[1].comm_id
    assert sorted((lk.peer, link_counts(lk)) for lk in seg.links) == [
        (0, (2, 8, 8, 2, 2, 8, 2)), (1, (2, 8, 8, 2, 2, 8, 2))]
    app.proceed()
    assert app.finish() == 0


# ---------------------------------------------------------------------------------------------- the plugin alone


@pytest.mark.parametrize("version", [4, 5, 6])
def test_profiler_plugin_alone_records_per_peer_progress(tmp_path: Path, fakes: Path, lib: Path,
                                                         procs: list[Proc], version: int) -> None:
    """The harness dlopens the plugin (no preload, no NCCL) and plays a recorded event
    sequence for rank 1 of 4; the per-peer progress appears in the stats segment."""
    job = f"nccl{uuid.uuid4().hex[:10]}"
    env = job_env(tmp_path, fakes, lib, job, 1, 4, plugin=False)
    del env["LD_PRELOAD"]
    h = Proc([str(fakes / "profiler_harness"), str(lib), str(version)], env)
    procs.append(h)
    h.expect("PHASE1")
    assert f"PLUGIN hetobs v{version}" in h.lines
    mask = int(next(x for x in h.lines if x.startswith("INIT 0 MASK")).split()[-1])
    assert mask & (1 << 3) and mask & (1 << 4)                  # ProxyOp, ProxyStep
    assert bool(mask & (1 << 9)) == (version >= 5)               # CollApi: only where it exists
    seg = segment(tmp_path, job, 1)
    (comm,) = seg.comms
    assert (comm.size, comm.rank) == (4, 1)
    links = {lk.peer: lk for lk in seg.links}
    assert sorted(links) == [0, 2]
    # send to 2: ops posted 2 (one finished: 2 steps), steps sent 6+2, completed 3+2
    assert link_counts(links[2]) == (2, 8, 5, 1, 0, 0, 0)
    assert links[2].bytes_sent == 6 * 1000 + 2 * 500 and links[2].frames_sent == 8
    # recv from 0: 1 op posted, 5 steps arrived
    assert link_counts(links[0]) == (0, 0, 0, 0, 1, 5, 0)
    assert links[0].bytes_recv == 5000 and links[0].last_activity_ns > 0
    assert links[0].progress["last_change_ns"] > 0
    h.proceed()
    h.expect("PHASE2")
    links = {lk.peer: lk for lk in segment(tmp_path, job, 1).links}
    assert sorted(links) == [0, 2]  # the PXN op for rank 3 was not taken
    assert link_counts(links[2]) == (2, 8, 8, 2, 0, 0, 0)
    assert link_counts(links[0]) == (0, 0, 0, 0, 1, 6, 1)
    h.proceed()
    assert h.finish() == 0, h.stderr()
    assert "DONE 0" in h.lines


# ---------------------------------------------------------------------------------------------- staying out


def test_without_a_usable_cuda_runtime_calls_are_forwarded(tmp_path: Path, fakes: Path, lib: Path) -> None:
    """NCCL, and no CUDA runtime in the process: with none installed the interposer stays
    inert (nothing created); with one installed but no GPU (as on this machine, which has
    CUDA 13's libcudart) it cannot make events, so ops are forwarded and not recorded."""
    import ctypes.util

    job = f"nccl{uuid.uuid4().hex[:10]}"
    env = job_env(tmp_path, fakes / "nocuda", lib, job, 0, 1, plugin=False)
    out = subprocess.run([str(fakes / "nocuda" / "app")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    if ctypes.util.find_library("cudart") is None:
        assert not (tmp_path / "jobs").exists()
    else:
        meta = rank_file(tmp_path, job, 0)
        assert meta["exited_cleanly"] is True  # nothing was left in flight: nothing was watched


def test_inert_with_watchdog_off_and_plugin_declines(tmp_path: Path, fakes: Path, lib: Path) -> None:
    job = f"nccl{uuid.uuid4().hex[:10]}"
    env = job_env(tmp_path, fakes, lib, job, 0, 1, HETOBS_WATCHDOG="0")
    out = subprocess.run([str(fakes / "nccl_app"), "0", "1", "ops"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["OPS_DONE", "DONE"]
    assert "init failed" in out.stderr  # only init may fail: NCCL then runs without the plugin
    assert not (tmp_path / "jobs").exists()


def test_bad_setting_is_one_line_and_the_job_runs(tmp_path: Path, fakes: Path, lib: Path) -> None:
    job = f"nccl{uuid.uuid4().hex[:10]}"
    env = job_env(tmp_path, fakes, lib, job, 0, 1, HETOBS_RECORDS="lots")
    out = subprocess.run([str(fakes / "nccl_app"), "0", "1", "ops"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0
    assert out.stdout.split() == ["OPS_DONE", "DONE"]
    lines = [x for x in out.stderr.splitlines() if "HETOBS_RECORDS" in x]
    assert len(lines) == 1 and "lots" in lines[0], out.stderr


def test_preloaded_into_a_process_without_nccl(tmp_path: Path, lib: Path) -> None:
    env = {**os.environ, "LD_PRELOAD": str(lib), "HETOBS_DIR": str(tmp_path / "jobs"), "HETOBS_JOB_ID": "x"}
    out = subprocess.run([sys.executable, "-c", "print('ok')"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "ok\n" and out.stderr == ""
    assert not (tmp_path / "jobs").exists()


def test_stays_out_when_another_hetobs_runtime_watches_the_process(tmp_path: Path, fakes: Path, lib: Path) -> None:
    """hetobs in Python already owns this rank's stats segment; a second runtime in the same
    process would clobber it, so the preloaded interposer steps aside (one warning) and NCCL
    calls still work."""
    code = (
        "import ctypes, hetobs\n"
        "comm = hetobs.init()\n"
        "ctypes.CDLL('libcudart.so.12', mode=ctypes.RTLD_GLOBAL)\n"
        "ctypes.CDLL('libnccl.so.2', mode=ctypes.RTLD_GLOBAL)\n"
        "g = ctypes.CDLL(None)  # the global scope: the preloaded interposer's ncclCommInitRank\n"
        "class Id(ctypes.Structure):\n"
        "    _fields_ = [('internal', ctypes.c_char * 128)]\n"
        "c, buf = ctypes.c_void_p(), ctypes.create_string_buffer(64)\n"
        "r1 = g.ncclCommInitRank(ctypes.byref(c), 1, Id(), 0)\n"
        "r2 = g.ncclAllReduce(buf, buf, ctypes.c_size_t(4), 7, 0, c, None)\n"
        "r3 = g.ncclCommDestroy(c)\n"
        "print('RESULT', r1, r2, r3, len(comm.records()))\n")
    job = f"nccl{uuid.uuid4().hex[:10]}"
    env = job_env(tmp_path, fakes, lib, job, 0, 1, MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["RESULT", "0", "0", "0", "0"]
    assert out.stderr.count("another hetobs runtime already watches this process") == 1, out.stderr


def test_torchrun_static_launch_shares_one_derived_job(tmp_path: Path, fakes: Path, lib: Path,
                                                       procs: list[Proc]) -> None:
    """No job id (torchrun's TORCHELASTIC_RUN_ID=none): the interposer has no rendezvous to agree
    on rank 0's id, so both ranks derive one from MASTER_ADDR:MASTER_PORT — not "none", one job
    directory for both, and they still find each other's side channel."""
    from hetobs.ports import free_port

    port = str(free_port())
    unset = {"HETOBS_JOB_ID": "", "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    apps = [Proc([str(fakes / "nccl_app"), str(r), "2", "stall"],
                 job_env(tmp_path, fakes, lib, "unused", r, 2, HETOBS_HANG_TIMEOUT="300", **unset)) for r in (0, 1)]
    procs.extend(apps)
    for app in apps:
        app.expect("STALLED")
    (job_dir,) = list((tmp_path / "jobs").iterdir())
    assert job_dir.name.startswith("launch-") and job_dir.name != "none"
    wait_for(lambda: all(rank_file(tmp_path, job_dir.name, r)["side_channel"]["port"] for r in (0, 1)),
             what="both ranks to know both side channels")
    for app in apps:
        app.proceed()
        assert app.finish() == 0
