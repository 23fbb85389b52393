"""The live stats segment read from outside the rank (hetobs/stats.py), including bad input.

Segments come from real rank processes (world size 1, so no rendezvous partner is
needed); broken ones are made by copying a real segment and damaging the copy.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hetobs import stats

RANK_BODY = """
import os, sys, numpy as np, hetobs
comm = hetobs.init()
x = np.ones(256, np.float32)
for _ in range(7):
    comm.all_reduce(x)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()          # the test reads the segment here, then lets us go (or kills us)
"""


def _start_rank(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    job = f"seg{uuid.uuid4().hex[:10]}"
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1",
               HETOBS_JOB_ID=job, HETOBS_DIR=str(tmp_path / "hetobs"), HETOBS_DEBUG="ERROR")
    p = subprocess.Popen([sys.executable, "-c", RANK_BODY], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p, job


@pytest.fixture
def live_rank(tmp_path: Path):
    p, job = _start_rank(tmp_path)
    try:
        yield p, job
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        for path in stats.segment_paths(job):
            os.unlink(path)


def test_layout_matches_the_native_structs() -> None:
    from hetobs import _core

    native = _core.stats_layout()
    # Version 5 then the suspected-hang counters appended to it (8-aligned after the boot id).
    assert stats._SUSPECT_AT == (stats._HEADER.size + stats._HEADER_V4.size + stats._HEADER_V5.size + 7) // 8 * 8
    assert native["sizeof.StatsHeader"] == stats._SUSPECT_AT + stats._HEADER_SUSPECT.size
    ops_end = stats._COMM_HEAD.size + len(stats.OP_KINDS) * stats._OPKIND.size
    assert native["CommStats.arrivals_judged"] == ops_end  # appended: shorter-layout readers skip them
    assert native["CommStats.last_arrival_lag_ns"] == ops_end + 16
    assert native["CommStats.arrival_lag"] == ops_end + 40
    assert native["sizeof.CommStats"] == ops_end + stats._ARRIVALS.size + stats._DIGESTS.size
    assert native["sizeof.LinkStats"] == stats._LINK.size + stats._HEALTH.size
    assert native["LinkStats.health"] == stats._LINK.size  # appended: shorter-layout readers skip it
    assert native["sizeof.OpRecord"] == stats._RECORD.size + stats._RECORD_NAMES.size + stats._RECORD_ARRIVAL.size
    assert native["OpRecord.last_arrival_rank"] == stats._RECORD.size + stats._RECORD_NAMES.size
    assert native["OpRecord.arrival_lag_ns"] == native["OpRecord.last_arrival_rank"] + 8
    assert native["OpRecord.device"] == stats._RECORD.size  # version 4's names follow the older fields
    assert native["StatsHeader.island_device"] == stats._HEADER.size
    assert native["StatsHeader.island_library"] == stats._HEADER.size + 16
    assert native["StatsHeader.boot_id"] == _boot_id_at()  # version 5's, after version 4's names
    assert native["OpRecord.library"] == native["OpRecord.device"] + 16
    # Field offsets the reader depends on, computed from its struct format.
    fmt = stats._HEADER.format
    for field_name, key in [("heartbeat_ns", "StatsHeader.heartbeat_ns"), ("records_next", "StatsHeader.records_next"),
                            ("wall_minus_mono_ns", "StatsHeader.wall_minus_mono_ns"), ("job", "StatsHeader.job"),
                            ("island", "StatsHeader.island"), ("island_vendor_ns", "StatsHeader.island_vendor_ns"),
                            ("island_ops", "StatsHeader.island_ops")]:
        idx = stats._HEADER_FIELDS.index(field_name)
        prefix = struct.Struct(_prefix_format(fmt, idx))
        assert prefix.size == native[key], field_name


def _prefix_format(fmt: str, n_fields: int) -> str:
    """The struct format of the first n fields of `fmt` (count-prefixed codes such as 64s are one field)."""
    out, count, i = "<", 0, 1
    while count < n_fields:
        j = i
        while fmt[j].isdigit():
            j += 1
        out += fmt[i:j + 1]
        if fmt[j] != "x":
            count += 1
        i = j + 1
    return out


def test_live_segment_reads_counters_and_records(live_rank) -> None:
    p, job = live_rank
    [path] = stats.segment_paths(job)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    seg = stats.read_segment(path, records=5)
    assert (seg.job, seg.rank, seg.world_size, seg.pid) == (job, 0, 1, p.pid)
    assert seg.process == "alive" and not seg.stale and not seg.exited_cleanly
    [comm] = seg.comms
    assert comm.ops["all_reduce"].calls == 7 and comm.ops["all_reduce"].bytes == 7 * 1024
    assert comm.coll_seq == 7 and comm.inflight_op is None
    assert sum(comm.ops["all_reduce"].latency) == 7
    assert comm.ops["all_reduce"].busbw[0] == 7  # one rank: the busbw factor is 0 (nothing crosses a link)
    assert [r["collective_seq_id"] for r in seg.records] == [3, 4, 5, 6, 7]
    assert all(r["state"] == "completed" and r["op"] == "all_reduce" for r in seg.records)


def test_segment_removed_at_clean_exit(live_rank) -> None:
    p, job = live_rank
    assert stats.segment_paths(job)
    p.communicate("go\n", timeout=30)
    assert p.returncode == 0
    assert stats.segment_paths(job) == []


def test_stopped_then_dead_process_is_recognised(live_rank) -> None:
    p, job = live_rank
    [path] = stats.segment_paths(job)
    os.kill(p.pid, signal.SIGSTOP)
    os.waitpid(p.pid, os.WUNTRACED)  # returns once the kernel has stopped it
    try:
        assert stats.read_segment(path).process == "stopped"
    finally:
        os.kill(p.pid, signal.SIGCONT)
    p.kill()
    p.wait()
    seg = stats.read_segment(path)  # a killed rank leaves its segment: history, not live state
    assert seg.process == "dead" and seg.stale


def _damaged_copy(src: str, tmp_path: Path, offset: int, data: bytes) -> str:
    raw = bytearray(Path(src).read_bytes())
    raw[offset:offset + len(data)] = data
    dst = tmp_path / "damaged-segment"
    dst.write_bytes(bytes(raw))
    return str(dst)


@pytest.mark.parametrize("other", [1, stats.VERSION + 1])
def test_other_version_is_refused_with_the_file_named(live_rank, tmp_path: Path, other: int) -> None:
    _, job = live_rank
    [path] = stats.segment_paths(job)
    bad = _damaged_copy(path, tmp_path, 8, struct.pack("<I", other))
    want = rf"damaged-segment: stats layout version {other}, this hetobs reads versions 2, 3, 4, 5"
    with pytest.raises(stats.StatsError, match=want):
        stats.read_segment(bad)


def test_a_version_2_segment_reads_without_relay_counts(live_rank, tmp_path: Path) -> None:
    """Version 3 only grew CommStats by the relay slot: a rank still on a version-2 build (comm_bytes
    without it) reads as before, every other kind counted, relay absent rather than misread."""
    _, job = live_rank
    [path] = stats.segment_paths(job)
    comm_bytes_at = 20  # magic, version, header_bytes, comm_capacity
    v2_comm_bytes = stats._COMM_HEAD.size + 11 * stats._OPKIND.size
    raw = bytearray(Path(path).read_bytes())
    raw[8:12] = struct.pack("<I", 2)
    raw[comm_bytes_at:comm_bytes_at + 4] = struct.pack("<I", v2_comm_bytes)
    old = tmp_path / "v2-segment"
    old.write_bytes(bytes(raw))
    [comm] = stats.read_segment(str(old)).comms  # one comm: its slot starts where it did
    assert comm.ops["all_reduce"].calls == 7 and "relay" not in comm.ops
    assert "relay" in stats.read_segment(path).comms[0].ops
    short = _damaged_copy(str(old), tmp_path, comm_bytes_at, struct.pack("<I", v2_comm_bytes - 8))
    with pytest.raises(stats.StatsError, match="comm_bytes .* too small for version 2"):
        stats.read_segment(short)


def test_foreign_and_truncated_files_are_refused(live_rank, tmp_path: Path) -> None:
    _, job = live_rank
    [path] = stats.segment_paths(job)
    foreign = _damaged_copy(path, tmp_path, 0, b"NOTOURS!")
    with pytest.raises(stats.StatsError, match="not a hetobs stats segment"):
        stats.read_segment(foreign)
    short = tmp_path / "short"
    short.write_bytes(Path(path).read_bytes()[:5000])
    with pytest.raises(stats.StatsError, match=r"short: truncated"):
        stats.read_segment(str(short))
    with pytest.raises(stats.StatsError, match="cannot open"):
        stats.read_segment(str(tmp_path / "missing"))


def test_reused_pid_is_stale(live_rank, tmp_path: Path) -> None:
    _, job = live_rank
    [path] = stats.segment_paths(job)
    start = stats._HEADER_FIELDS.index("process_start_ticks")
    off = struct.Struct(_prefix_format(stats._HEADER.format, start)).size
    reused = _damaged_copy(path, tmp_path, off, struct.pack("<Q", 1))
    seg = stats.read_segment(reused)
    assert seg.process == "reused" and seg.stale


def _boot_id_at() -> int:
    return stats._HEADER.size + stats._HEADER_V4.size


def test_segment_of_another_boot_is_stale_and_cleaned_while_the_pid_lives(live_rank, tmp_path: Path) -> None:
    """After a reboot a pid (even with equal start ticks) is another process: the boot id says so."""
    from hetobs.clean import clean

    p, job = live_rank
    [path] = stats.segment_paths(job)
    here = stats.read_segment(path)
    assert here.boot_id == stats.boot_id() and len(here.boot_id) == 36 and here.process == "alive"
    shm = tmp_path / "shm"
    shm.mkdir()
    earlier = _damaged_copy(path, tmp_path, _boot_id_at(), b"00000000-0000-4000-8000-000000000000")
    os.replace(earlier, shm / os.path.basename(path))  # same name, same live pid and start ticks
    seg = stats.read_segment(str(shm / os.path.basename(path)))
    assert seg.pid == p.pid and seg.process == "dead" and seg.stale
    result = clean(shm_dir=str(shm), socket_dir=str(tmp_path / "no-sockets"))
    assert [(r.kind, r.why) for r in result.removed] == [
        ("stats_segment", f"pid {p.pid} (rank 0 of job {job}) ran in an earlier boot of this machine")]
    assert stats.read_segment(path).process == "alive"  # the live rank's own segment is untouched


def test_a_version_4_segment_without_a_boot_id_is_judged_by_pid(live_rank, tmp_path: Path) -> None:
    _, job = live_rank
    [path] = stats.segment_paths(job)
    raw = bytearray(Path(path).read_bytes())
    raw[8:12] = struct.pack("<I", 4)
    raw[_boot_id_at():_boot_id_at() + 40] = bytes(40)
    old = tmp_path / "v4-segment"
    old.write_bytes(bytes(raw))
    seg = stats.read_segment(str(old))
    assert seg.boot_id == "" and seg.process == "alive"


def test_rank_file_carries_the_boot_id_and_another_boot_reads_dead(live_rank, tmp_path: Path) -> None:
    import json
    import socket

    from hetobs.jobs import rank_state

    p, job = live_rank
    meta = json.loads((tmp_path / "hetobs" / job / "ranks" / "rank-0.json").read_text())
    assert meta["boot_id"] == stats.boot_id() and meta["pid"] == p.pid
    host = socket.gethostname()
    assert rank_state(meta, host) == "running"
    assert rank_state({**meta, "boot_id": "00000000-0000-4000-8000-000000000000"}, host) == "dead"
