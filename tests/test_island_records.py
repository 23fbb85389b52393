"""Hierarchical (island) ops in the records and everything that reads them, without torch.

Two ranks in islands "alpha" and "beta" record hierarchical ops through ExternalComm
the way the hetobs_islands backend does (tests/rank_programs.py `island_ops`: measured
phase times, one record per op per rank), leave one op in flight in its relay phase
and wait at a gate. Meanwhile the job is read from outside, the way a user would:
`hetobs dump --job`, the stats segments (another process), `hetobs trace`, `hetobs top`,
`hetobs exporter`'s /metrics, the diagnosis loader, and the watchdog's own hang dump
(HETOBS_HANG_TIMEOUT=2: the held op stops moving). Then the gates open and each rank
reports its records(). Every surface must show the phases the ranks measured.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _launch import Job, new_job_id, run_python  # noqa: E402

from hetobs import stats  # noqa: E402

ISLANDS = ["alpha", "beta"]
DEVICES = ["standin", "cpu"]  # names only: the records carry them, nothing touches a device
LIBRARIES = ["sccl", "gloo"]
COMM_ID = 0x15_1A_0D  # the island communicator (the native world is comm 0)
OPS = 3  # finished hierarchical ops per rank; op OPS + 1 stays in flight
PHASE_KEYS = ("vendor_ns", "d2h_ns", "wire_ns", "h2d_ns", "chunks")
SAVED_DUMPS = Path(__file__).resolve().parent / "data" / "dumps"


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetobs.cli", *argv], capture_output=True, text=True,
                          timeout=timeout)


def _wait_for_files(folder_glob: Path, names: set[str], timeout: float) -> Path:
    """The first folder matching the glob that holds every file in `names` (dumps appear by rename)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for d in folder_glob.parent.glob(folder_glob.name):
            if {p.name for p in d.glob("rank-*.json")} >= names:
                return d
        time.sleep(0.05)  # the watchdog writes files; nothing to wait on but the directory
    raise AssertionError(f"no {folder_glob} with {sorted(names)} within {timeout}s")


def _scrape(job: Job) -> str:
    """One /metrics page from a real `hetobs exporter` reading the job's segments."""
    p = subprocess.Popen([sys.executable, "-m", "hetobs.cli", "exporter", "--job", job.job_id, "--port", "0", "--dir",
                          str(job.hetobs_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        assert p.stderr is not None
        buf, end = b"", time.monotonic() + 30
        while b"/metrics" not in buf:
            left = end - time.monotonic()
            assert left > 0 and p.poll() is None, f"exporter did not start: {buf.decode(errors='replace')}"
            if select.select([p.stderr], [], [], left)[0]:
                buf += os.read(p.stderr.fileno(), 65536)
        url = buf.decode().split("http://", 1)[1].split("/metrics", 1)[0]
        with urllib.request.urlopen(f"http://{url}/metrics", timeout=30) as r:
            return r.read().decode()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        p.stderr.close()  # type: ignore[union-attr]


def _sample(page: str, name: str, **labels: str) -> float:
    for line in page.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not in /metrics")


@pytest.fixture(scope="module")
def island_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Run the job once; collect what each surface shows while the last op is in flight."""
    workdir = tmp_path_factory.mktemp("islands")
    job = Job("island_ops", 2, {"comm_id": COMM_ID, "islands": ISLANDS, "devices": DEVICES, "libraries": LIBRARIES,
                                "ops": OPS}, workdir=workdir,
              gates=["finish-0", "finish-1"], env={"HETOBS_HANG_TIMEOUT": "2"}, job_id=new_job_id("isl"))
    seen: dict[str, Any] = {"job": job}
    try:
        job.start()
        held = [job.wait_event(r, "in_flight", timeout=60) for r in range(2)]
        seen["sent"] = [ev["phases"] for ev in held]
        seen["segments"] = [stats.read_segment(ev["segment"], records=64) for ev in held]
        seen["segment_bytes"] = Path(held[0]["segment"]).read_bytes()
        d = _cli("dump", "--job", job.job_id, "--dir", str(job.hetobs_dir), "--json")
        assert d.returncode == 0, d.stderr
        seen["incident"] = json.loads(d.stdout)["incident"]
        jdir = job.hetobs_dir / job.job_id
        seen["dumps"] = [json.loads((jdir / "incidents" / seen["incident"] / f"rank-{r}.json").read_text())
                         for r in range(2)]
        hang = _wait_for_files(jdir / "incidents" / f"hang-c{COMM_ID}-s{OPS + 1}", {"rank-0.json", "rank-1.json"},
                               timeout=30)
        seen["hang_dumps"] = [json.loads((hang / f"rank-{r}.json").read_text()) for r in range(2)]
        traces = {}
        for name, extra in (("incident", ["--incident", seen["incident"]]), ("live", ["--live"])):
            out = workdir / f"trace-{name}.json"
            t = _cli("trace", "--job", job.job_id, "--dir", str(job.hetobs_dir), "-o", str(out), *extra)
            assert t.returncode == 0, t.stderr
            traces[name] = json.loads(out.read_text())
        seen["traces"] = traces
        top = _cli("top", "--job", job.job_id, "--dir", str(job.hetobs_dir), "--json", "--interval", "0.1")
        assert top.returncode == 0, top.stderr
        seen["top"] = json.loads(top.stdout)
        seen["metrics"] = _scrape(job)
        from hetobs.diagnosis.loader import load_job
        from hetobs.diagnosis.types import Options

        seen["loaded"] = load_job(Options(job_dir=jdir, incident=seen["incident"], tail_entries=64))
        for r in range(2):
            job.gate_open(f"finish-{r}")
        seen["results"] = job.wait(timeout=60).check()
        yield seen
    finally:
        job.close()
        for path in stats.segment_paths(job.job_id):  # only if a rank was killed: a clean exit removes its own
            os.unlink(path)


def _island_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("comm_id") == COMM_ID]


def test_records_carry_island_and_phases(island_job: dict[str, Any]) -> None:
    for r, res in enumerate(island_job["results"]):
        recs = res["records"]
        assert [x["collective_seq_id"] for x in recs] == list(range(1, OPS + 2))  # one seq per op, every rank
        assert all(x["backend"] == "islands" and x["island"] == ISLANDS[r] for x in recs)
        assert all(x["device_type"] == DEVICES[r] and x["library"] == LIBRARIES[r] for x in recs)
        assert [x["phases"] for x in recs[:OPS]] == res["phases"]
        assert all(p["vendor_ns"] > 0 and p["wire_ns"] > 0 and p["chunks"] == 1 for p in res["phases"])
        assert recs[OPS]["phases"] == dict.fromkeys(PHASE_KEYS, 0)  # ended without phases


def test_native_records_have_no_island(island_job: dict[str, Any]) -> None:
    seg = island_job["segments"][0]
    native = [x for x in seg.records if x["comm_id"] == 0]
    assert native and all(x["island"] is None and x["phases"] is None for x in native)
    assert all("island" not in e and "phases" not in e for e in island_job["dumps"][0]["entries"]
               if e["comm_id"] == 0)


def test_on_demand_dump_carries_island_phases_and_in_flight_phase(island_job: dict[str, Any]) -> None:
    for r, doc in enumerate(island_job["dumps"]):
        assert doc["version"] == "2.1"
        entries = _island_entries(doc["entries"])
        assert [e["phases"] for e in entries[:OPS]] == island_job["sent"][r]
        assert all(e["island"] == ISLANDS[r] and e["backend"] == "islands" for e in entries)
        assert all(e["device_type"] == DEVICES[r] and e["library"] == LIBRARIES[r] for e in entries)
        assert entries[:OPS][0]["profiling_name"] == "hetobs:all_reduce"  # Flight Recorder fields as before
        [comm] = [c for c in doc["comms"] if c["comm_id"] == COMM_ID]
        f = comm["in_flight"]
        assert comm["island"] == ISLANDS[r] and f["island"] == ISLANDS[r]
        assert f["phase"] == "relay" and f["collective_seq_id"] == OPS + 1
        [native] = [c for c in doc["comms"] if c["comm_id"] == 0]
        assert "island" not in native


def test_watchdog_dumps_a_held_island_op_with_its_phase(island_job: dict[str, Any]) -> None:
    assert "watchdog" in {doc["reason"] for doc in island_job["hang_dumps"]}
    for r, doc in enumerate(island_job["hang_dumps"]):
        [comm] = [c for c in doc["comms"] if c["comm_id"] == COMM_ID]
        assert comm["in_flight"]["phase"] == "relay" and comm["in_flight"]["island"] == ISLANDS[r]
        if doc["reason"] == "watchdog":
            assert f"seq {OPS + 1} on comm {COMM_ID}" in doc["cause"]


def test_segment_read_from_another_process_carries_them(island_job: dict[str, Any]) -> None:
    for r, seg in enumerate(island_job["segments"]):
        assert seg.island == ISLANDS[r] and seg.island_device == DEVICES[r] and seg.island_library == LIBRARIES[r]
        recs = [x for x in seg.records if x["comm_id"] == COMM_ID]
        assert [x["phases"] for x in recs[:OPS]] == island_job["sent"][r]
        assert recs[OPS]["state"] == "started" and recs[OPS]["island"] == ISLANDS[r]
        assert all(x["device_type"] == DEVICES[r] and x["library"] == LIBRARIES[r] for x in recs)
        totals = seg.island_totals
        assert totals is not None and totals.ops == OPS and totals.chunks == OPS
        for phase in stats.ISLAND_PHASES:
            assert totals.phase_ns[phase] == sum(p[f"{phase}_ns"] for p in island_job["sent"][r])


def test_old_segment_version_is_a_clear_error(island_job: dict[str, Any], tmp_path: Path) -> None:
    raw = bytearray(island_job["segment_bytes"])
    raw[8:12] = struct.pack("<I", 1)  # StatsHeader.version of the layout before islands
    old = tmp_path / "hetobs-stats-old-r0"
    old.write_bytes(bytes(raw))
    want = f"{old}: stats layout version 1, this hetobs reads versions 2, 3, 4, 5"
    with pytest.raises(stats.StatsError, match=re.escape(want)):
        stats.read_segment(str(old))
    assert stats.VERSION == 5  # islands (2), relay slot (3), device and library names (4), boot id (5): all read


def _phase_tracks(doc: dict[str, Any], rank: int) -> dict[str, list[dict[str, Any]]]:
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
             and e["pid"] == rank}
    out: dict[str, list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == rank and e.get("cat") == "island_phase":
            out.setdefault(names[e["tid"]], []).append(e)
    return out


@pytest.mark.parametrize("source", ["incident", "live"])
def test_trace_has_a_track_per_phase(island_job: dict[str, Any], source: str) -> None:
    doc = island_job["traces"][source]
    for r in range(2):
        tracks = _phase_tracks(doc, r)
        assert sorted(tracks) == sorted(f"comm {COMM_ID}: {p}" for p in stats.ISLAND_PHASES)
        tids = {e["tid"] for evs in tracks.values() for e in evs}
        assert len(tids) == 4  # one thread per phase: overlapping phases do not share a track
        for phase in stats.ISLAND_PHASES:
            evs = tracks[f"comm {COMM_ID}: {phase}"]
            assert [e["dur"] for e in evs] == [p[f"{phase}_ns"] / 1000.0 for p in island_job["sent"][r]]
            assert all(e["args"]["island"] == ISLANDS[r] and e["args"]["chunks"] == 1 for e in evs)
        ops = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == r and e.get("cat") == "collective"
               and e["args"]["comm_id"] == COMM_ID]
        assert len(ops) == OPS + 1 and all(e["args"]["island"] == ISLANDS[r] for e in ops)
        held = [e for e in ops if e["args"].get("in_flight")]
        assert len(held) == 1
        if source == "incident":
            assert held[0]["args"]["phase"] == "relay"
    assert set(doc["otherData"]["phases"].values()) == set(stats.ISLAND_PHASES)


def test_top_shows_each_ranks_island(island_job: dict[str, Any]) -> None:
    ranks = island_job["top"]["ranks"]
    assert {r["rank"]: r["island"] for r in ranks} == dict(enumerate(ISLANDS))
    assert {r["rank"]: (r["island_device"], r["island_library"]) for r in ranks} == dict(enumerate(zip(DEVICES,
                                                                                                       LIBRARIES)))


def test_exporter_serves_phase_seconds(island_job: dict[str, Any]) -> None:
    page, job_id = island_job["metrics"], island_job["job"].job_id
    for r, island in enumerate(ISLANDS):
        labels = {"job_id": job_id, "rank": str(r), "island": island}
        assert _sample(page, "hetobs_rank_island", **labels, device=DEVICES[r], library=LIBRARIES[r]) == 1.0
        for phase in stats.ISLAND_PHASES:
            want = sum(p[f"{phase}_ns"] for p in island_job["sent"][r]) / 1e9
            got = _sample(page, "hetobs_island_phase_seconds_total", **labels, phase=phase)
            assert got == pytest.approx(want, rel=1e-9)
        assert _sample(page, "hetobs_island_ops_total", **labels) == OPS
        assert _sample(page, "hetobs_island_relay_chunks_total", **labels) == OPS
    # the per-rank series others rely on keep their labels; scraped while the last op is held
    # past HETOBS_HANG_TIMEOUT=2 (the watchdog's hang dumps were written before), so each rank
    # has made no progress for at least that long
    for r in range(2):
        assert _sample(page, "hetobs_seconds_since_progress", job_id=job_id, rank=str(r)) >= 2.0
    assert not any("island=" in ln for ln in page.splitlines() if ln.startswith("hetobs_seconds_since_progress"))


def test_loader_parses_island_fields(island_job: dict[str, Any]) -> None:
    loaded = island_job["loaded"]
    assert loaded.problems == []
    for r in range(2):
        view = loaded.dumps[r].comms[COMM_ID]
        assert view.in_flight is not None and view.in_flight.phase == "relay"
        assert view.in_flight.rec.island == ISLANDS[r] and view.in_flight.rec.seq == OPS + 1
        done = [x for x in view.recent if x.state == "completed"]
        assert [x.island for x in done] == [ISLANDS[r]] * OPS
        assert [x.phases._asdict() for x in done] == island_job["sent"][r]  # type: ignore[union-attr]


def test_loader_names_the_slowest_phase(island_job: dict[str, Any]) -> None:
    view = island_job["loaded"].dumps[0].comms[COMM_ID]
    for rec, sent in zip([x for x in view.recent if x.state == "completed"], island_job["sent"][0]):
        busiest = max(stats.ISLAND_PHASES, key=lambda p: sent[f"{p}_ns"])
        assert rec.phases is not None and rec.phases.slowest() == busiest


PHASE_PROGRESS_BODY = """
import time, hetobs
from hetobs import _core, stats
hetobs.init()
path = _core.runtime_info()["stats_segment"]
ext = _core.ExternalComm(0x15_1A_12, [0], 0, 4, 0, "islands:progress", island="eps")
token = ext.begin(0, 6, 0, -1, 1, 1, 4)
before = stats.read_segment(path).last_progress_ns
# Progress is stamped from the monotonic clock (shown as wall time through a fixed offset), so move
# that clock 5 ms past the moment `before` was read; the wall clock may be slewed against it.
moved = time.monotonic_ns() + 5_000_000
while time.monotonic_ns() < moved:
    pass
ext.set_phase(token, "wire")
after = stats.read_segment(path).last_progress_ns
ext.end(token, True)
emit({"before": before, "after": after})
"""


def test_a_phase_change_is_progress(core: Any, tmp_path: Path) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
           "HETOBS_JOB_ID": new_job_id("islp"), "HETOBS_DIR": str(tmp_path / "hetobs"), "HETOBS_DEBUG": "ERROR"}
    r = run_python(PHASE_PROGRESS_BODY, env=env, timeout=60, workdir=tmp_path)
    assert r.returncode == 0 and r.result is not None, r.stderr
    assert r.result["after"] >= r.result["before"] + 5_000_000


def test_end_takes_the_ops_real_times(core: Any) -> None:
    ext = core.ExternalComm(0x15_1A_11, [0], 0, 4, 0, "islands:times", island="delta")
    token = ext.begin(0, 6, 0, -1, 1, 1, 4)
    start = time.monotonic_ns() - 5_000_000
    ext.end(token, True, None, start, start + 3_000_000, {"wire_ns": 2_000_000, "chunks": 7})
    [rec] = [x for x in core.records() if x["comm_id"] == 0x15_1A_11]
    assert rec["duration_ms"] == pytest.approx(3.0)
    assert rec["phases"] == {"vendor_ns": 0, "d2h_ns": 0, "wire_ns": 2_000_000, "h2d_ns": 0, "chunks": 7}


def test_saved_dumps_still_load() -> None:
    """Every saved job directory loads; 1.0 records have no island fields, the saved 1.1 island job has them."""
    from hetobs.diagnosis.loader import load_job
    from hetobs.diagnosis.types import Options

    cases = sorted({p.parent for p in SAVED_DUMPS.rglob("incidents")})  # every saved job directory
    assert any("v1.1" in c.parts for c in cases)
    for case in cases:
        loaded = load_job(Options(job_dir=case, tail_entries=64))
        assert loaded.dumps, case
        assert not [p for p in loaded.problems if "schema" in p.problem or "version" in p.problem], case
        recs = [x for d in loaded.dumps.values() for v in d.comms.values() for x in v.recent]
        assert recs, case
        if "v1.0" in case.parts:
            assert all(x.island is None and x.phases is None for x in recs), case
    saved = load_job(Options(job_dir=SAVED_DUMPS / "v1.1" / "islands", tail_entries=64))
    for r, island in enumerate(ISLANDS):
        view = saved.dumps[r].comms[COMM_ID]
        done = [x for x in view.recent if x.state == "completed"]
        assert len(done) == OPS and all(x.island == island and x.phases and x.phases.vendor_ns > 0 for x in done)
        assert view.in_flight is not None and view.in_flight.phase == "relay"
        assert all(x.island is None for x in saved.dumps[r].comms[0].recent)


def test_bad_phase_input_is_a_clear_error_and_the_op_still_ends(core: Any) -> None:
    ext = core.ExternalComm(0x15_1A_0E, [0], 0, 4, 0, "islands:bad", island="gamma")
    token = ext.begin(0, 6, 0, -1, 1, 1, 4)
    with pytest.raises(ValueError, match="set_phase: phase 'uplink': expected none, vendor, relay, d2h, wire or h2d"):
        ext.set_phase(token, "uplink")
    with pytest.raises(ValueError, match="end: phases key 'wire': expected vendor_ns, d2h_ns, wire_ns, h2d_ns or "
                                         "chunks"):
        ext.end(token, True, phases={"wire": 5})
    token = ext.begin(0, 6, 0, -1, 1, 1, 4)
    with pytest.raises(TypeError, match=r"end: phases\['wire_ns'\] must be an int, not str"):
        ext.end(token, True, phases={"wire_ns": "5"})
    recs = [x for x in core.records() if x["comm_id"] == 0x15_1A_0E]
    # no op left in flight by a caller's mistake
    assert [(x["state"], x["island"]) for x in recs] == [("completed", "gamma")] * 2
    with pytest.raises(ValueError, match="needs its rank's island name"):
        core.ExternalComm(0x15_1A_0F, [0], 0, 4, 0, "islands:none")
    with pytest.raises(ValueError, match="island name 'an-island-name-too-long' is longer than 15 bytes"):
        core.ExternalComm(0x15_1A_0F, [0], 0, 1, 0, "gloo:x", island="an-island-name-too-long")
    plain = core.ExternalComm(0x15_1A_10, [0], 0, 1, 0, "gloo:positional")  # old positional form still works
    t = plain.begin(0, 6, 0, -1, 1, 1, 4)
    plain.end(t, False, "boom")
    [rec] = [x for x in core.records() if x["comm_id"] == 0x15_1A_10]
    assert rec["error"] == "boom" and rec["island"] is None and rec["phases"] is None and plain.island == ""
