"""Diagnosis at scale: hetobs against torch's own Flight Recorder analyzer, on one synthetic incident.

The incident: every rank ran 200 all_reduces on one communicator; one rank never
called the last (seq 200) while the others wait in it. It is written three ways:
- Flight Recorder dumps as torch writes them, NCCL style (pg_config lists every
  rank, as a string, in every file): pickles (the only format `torchfrtrace` reads)
  and JSON (`_dump_fr_trace_json`);
- a hetobs job directory (docs/dump-schema.md): rank metadata plus one incident,
  200 records per rank; schema 2.1 (default): membership and ring once, in
  comms/comm-0-<hash>.json, a hash in every file, and the causes and waits as fields
  (`cause_info`, `waiting_on`); `--format 2.0`: without those; `--format 1.0`: the lists in
  every file.
Then each tool runs as a subprocess, CLI start-up included, and the table gives wall
time and the child's peak RSS (os.wait4). Each run's answer is checked: it must
name the missing rank. The files are read from the page cache (just written).

    .venv/bin/python bench/diagnose_scale.py                      # 64 256 1024 4096 16384
    .venv/bin/python bench/diagnose_scale.py --sizes 64,1024 --torch-max 1024

torchfrtrace runs up to --torch-max ranks (default 1024; 4096 takes minutes); Flight
Recorder files are written up to --fr-max ranks (default 16384: every FR file lists the
world, 65,536 of them would not fit on the disk).
Targets (issue 4): hetobs >= 10x faster than torchfrtrace at 1,024 ranks; 16,384 ranks
in < 30 s and < 4 GB. Issue 14: 65,536 ranks <= 60 s and <= 4 GiB, 16,384 <= 5 s:

    .venv/bin/python bench/diagnose_scale.py --sizes 16384,65536 --fr-max 0 --repeat 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

VENV_BIN = Path(sys.executable).parent
T0 = 1_764_500_000_000_000_000
COUNT = 262144


# --- writers -----------------------------------------------------------------------------

def fr_entries(n_records: int, last: int) -> list[dict]:
    out = []
    for seq in range(1, last + 1):
        t = T0 - (n_records - seq) * 50_000_000
        done = seq < n_records
        out.append({
            "record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": t,
            "input_sizes": [[COUNT]], "input_dtypes": ["Float"], "output_sizes": [[COUNT]],
            "output_dtypes": ["Float"], "state": "completed" if done else "started",
            "time_discovered_started_ns": t + 10_000, "time_discovered_completed_ns": t + 900_000 if done else None,
            "retired": done, "timeout_ms": 600000, "is_p2p": False, "thread_id": "1", "thread_name": "python",
            "frames": [{"name": "all_reduce", "filename": "/site-packages/torch/distributed/distributed_c10d.py",
                        "line": 3245},
                       {"name": "train_step", "filename": "/app/train.py", "line": 42},
                       {"name": "<module>", "filename": "/app/train.py", "line": 90}],
        })
    return out


def write_fr(folder: Path, world: int, culprit: int, n_records: int, pickles: bool) -> None:
    folder.mkdir(parents=True)
    (folder / "json").mkdir()
    if pickles:
        (folder / "pickle").mkdir()
    ranks = "[" + ", ".join(str(r) for r in range(world)) + "]"
    full, short = fr_entries(n_records, n_records), fr_entries(n_records, n_records - 1)
    full_json, short_json = json.dumps(full), json.dumps(short)
    for r in range(world):
        head = {"version": "2.10", "comm_lib_version": "2.21.5", "nccl_comm_state": {},
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
                "pg_status": {"0": {"last_enqueued_collective": n_records - (r == culprit),
                                    "last_started_collective": n_records - (r == culprit),
                                    "last_completed_collective": n_records - 1}}}
        text = json.dumps(head)[:-1] + ', "entries": ' + (short_json if r == culprit else full_json) + "}"
        (folder / "json" / f"nccl_trace_rank_{r}").write_text(text)
        if pickles:
            head["entries"] = short if r == culprit else full
            (folder / "pickle" / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(head))


def _entry_template(world: int, n_records: int) -> str:
    entries = []
    for seq in range(1, n_records + 1):
        t = T0 - (n_records - seq) * 50_000_000
        done = seq < n_records
        entries.append({
            "record_id": seq - 1, "pg_id": 0, "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": "hetobs:all_reduce", "input_sizes": [[COUNT]], "output_sizes": [[COUNT]],
            "input_dtypes": ["float32"], "output_dtypes": ["float32"], "state": "completed" if done else "started",
            "time_created_ns": t, "time_discovered_started_ns": t + 10_000,
            "time_discovered_completed_ns": t + 900_000 if done else None, "duration_ms": 0.89 if done else None,
            "op": "all_reduce", "comm_id": 0, "dtype": "float32", "count": COUNT, "out_count": COUNT,
            "bytes": COUNT * 4, "reduction": "sum", "root": None, "peer": None, "algorithm": "ring",
            "backend": "native", "device_type": "cpu", "comm_size": world, "comm_rank": -12345,
            "algbw_gbps": 1.178 if done else None, "busbw_gbps": 2.356 if done else None, "error": None,
        })
    return json.dumps(entries)


STACK_SLEEP = ('Current thread 0x00007f0000000001 (most recent call first):\n'
               '  File "/app/train.py", line 37 in load_batch\n  File "/app/train.py", line 90 in <module>\n')
STACK_WAIT = ('Current thread 0x00007f0000000001 (most recent call first):\n'
              '  File "/site-packages/hetobs/comm.py", line 210 in wait\n'
              '  File "/app/train.py", line 42 in train_step\n  File "/app/train.py", line 90 in <module>\n')


def write_hetobs(root: Path, job: str, world: int, culprit: int, n_records: int, version: str = "2.1") -> None:
    jd = root / job
    (jd / "ranks").mkdir(parents=True)
    inc_name = f"hang-c0-s{n_records}"
    inc = jd / "incidents" / inc_name
    inc.mkdir(parents=True)
    ranks = "[" + ",".join(str(r) for r in range(world)) + "]"
    if version.startswith("1."):
        members = '"global_ranks": %s, "ring": %s' % (ranks, ranks)
    else:  # docs/dump-schema.md "Communicator membership": the lists once, a hash everywhere
        text = "global_ranks=" + ranks[1:-1] + ";ring=" + ranks[1:-1]
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        (jd / "comms").mkdir()
        (jd / "comms" / f"comm-0-{digest}.json").write_text(
            '{"schema": "hetobs.comm", "version": "1.0", "job": "%s", "comm_id": 0, "hash": "%s", "size": %d, '
            '"written_by": 0, "global_ranks": %s, "ring": %s}' % (job, digest, world, ranks, ranks))
        members = '"membership": {"hash": "%s", "lowest_rank": 0}' % digest
    fields = version not in ("1.0", "2.0")  # 2.1: cause_info and waiting_on beside the sentences
    template = _entry_template(world, n_records)
    cut = template.rfind(', {"record_id"')
    short_template = template[:cut] + "]"  # the culprit never called the last op
    for r in range(world):
        prev, nxt = (r - 1) % world, (r + 1) % world
        meta = ('{"schema": "hetobs.rank", "version": "%s", "job": "%s", "rank": %d, "world_size": %d, '
                '"host": "node%d", "host_key": "boot-x:%d", "pid": %d, "process_start_time": 1000, '
                '"start_time_ns": %d, "side_channel": {"ip": "10.0.%d.%d", "port": 40000}, '
                '"stats_segment": "/dev/shm/hetobs-stats-%s-r%d", "hang_timeout_s": 300.0, '
                '"comms": [{"comm_id": 0, "size": %d, "rank": %d, %s, '
                '"transports": {"%d": "tcp", "%d": "tcp"}}], "exited_cleanly": false, "exit_time_ns": null}'
                % (version, job, r, world, r // 8, r // 8, 10000 + r, T0 - 3600 * 10**9, r // 256, r % 256, job, r,
                   world, r, members, prev, nxt))
        (jd / "ranks" / f"rank-{r}.json").write_text(meta)
        if r == culprit:
            in_flight = "null"
            last = n_records - 1
            stack = STACK_SLEEP
            entries = short_template.replace("-12345", str(r))
        else:
            peers = [{"peer": x, "global_peer": x, "transport": "tcp",
                      "send": {"posted": 2, "sent": 1, "acked": 1, "done": 1},
                      "recv": {"posted": 2, "received": 0, "done": 0},
                      "last_change_ns": T0 - 400 * 10**9, "seconds_since_change": 400.0} for x in (nxt, prev)]
            flight = {
                "record_id": n_records - 1, "collective_seq_id": n_records, "p2p_seq_id": 0, "op": "all_reduce",
                "dtype": "float32", "count": COUNT, "bytes": COUNT * 4, "root": None, "peer": None,
                "algorithm": "ring", "state": "started", "time_created_ns": T0 - 400 * 10**9,
                "time_discovered_started_ns": T0 - 400 * 10**9, "seconds_in_op": 400.0, "peers": peers}
            if fields:
                flight["waiting_on"] = [{"rank": x, "direction": d, "posted": 2, "done": 1 if d == "send" else 0}
                                        for x in (nxt, prev) for d in ("recv", "send")]
            in_flight = json.dumps(flight)
            last = n_records - 1
            stack = STACK_WAIT
            entries = template.replace("-12345", str(r))
        sc = {"asked": [], "answered": [], "unanswered": []}
        if r == 0:
            sc = {"asked": list(range(1, world)), "answered": list(range(1, world)), "unanswered": []}
        links = json.dumps([{"peer": x, "global_peer": x, "transport": "tcp", "bytes_sent": 2 * COUNT * n_records,
                             "bytes_recv": 2 * COUNT * n_records, "busy_ns": 100_000 * n_records,
                             "last_activity_ns": T0 - 400 * 10**9} for x in (nxt, prev)])
        cause_info = ""
        if fields:
            info = {"kind": "hang", "culprits": [nxt, prev], "reporter": r, "messengers": [], "op": "all_reduce",
                    "seq": n_records, "peer": None, "gone": False} if r == 0 else None
            cause_info = '"cause_info": %s, ' % json.dumps(info)
        dump = ('{"schema": "hetobs.dump", "version": "%s", "job": "%s", "incident": "%s", "rank": %d, '
                '"world_size": %d, "host": "node%d", "pid": %d, "process_start_time": 1000, "reason": "%s", '
                '"cause": %s, %s"requested_by": %s, "time_ns": %d, "heartbeat_ns": %d, "last_progress_ns": %d, '
                '"hang_timeout_s": 300.0, "side_channel": %s, "comms": [{"comm_id": 0, "size": %d, "rank": %d, '
                '%s, "last_coll_seq": %d, "last_p2p_seq": 0, "failed": false, '
                '"cause": null, %s"in_flight": %s, "links": %s}], "entries": %s, '
                '"python": {"status": "ok", "stacks": %s}}'
                % (version, job, inc_name, r, world, r // 8, 10000 + r, "watchdog" if r == 0 else "peer_request",
                   json.dumps(f"all_reduce seq {n_records} on comm 0: no progress for 400.0 s") if r == 0 else "null",
                   cause_info, "null" if r == 0 else "0", T0 + r * 1000, T0 - 10**7, T0 - 400 * 10**9,
                   json.dumps(sc), world, r, members, last, '"cause_info": null, ' if fields else "", in_flight,
                   links, entries, json.dumps(stack)))
        (inc / f"rank-{r}.json").write_text(dump)


# --- runner ------------------------------------------------------------------------------

CPU_S: dict[tuple[str, ...], float] = {}  # command -> CPU seconds (user + system) of its fastest run


def best_of(n: int, cmd: list[str], timeout: float) -> tuple[float, float, int, str]:
    """`timed` n times: the shortest wall time (the machine is shared and noisy), the largest RSS."""
    runs = [timed(cmd, timeout) for _ in range(max(1, n))]
    best = min(runs, key=lambda r: r[0])
    CPU_S[tuple(cmd)] = best[4]
    return best[0], max(r[1] for r in runs), max(r[2] for r in runs), best[3]


def timed(cmd: list[str], timeout: float) -> tuple[float, float, int, str, float]:
    """(wall seconds, peak RSS of the child in MiB, exit code, stdout, CPU seconds): on a shared
    machine the CPU time says what the wall time cannot."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        deadline = time.time() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.01)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        out.seek(0)
        text = out.read().decode(errors="replace")
    return wall, ru.ru_maxrss / 1024.0, p.returncode, text, ru.ru_utime + ru.ru_stime


def names_culprit(stdout: str, culprit: int) -> bool:
    try:
        doc = json.loads(stdout)
    except ValueError:
        return False
    return [(v["kind"], v["ranks"]) for v in doc.get("verdicts", []) if v["kind"] != "straggler"] == \
        [("rank_not_joined", [culprit])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64,256,1024,4096,16384")
    ap.add_argument("--torch-max", type=int, default=1024, help="largest world size to run torchfrtrace on")
    ap.add_argument("--fr-max", type=int, default=16384, help="largest world size to write Flight Recorder files for")
    ap.add_argument("--format", default="2.1", choices=("1.0", "2.0", "2.1"), help="hetobs dump schema to write")
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir, removed after)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool and size; the table shows the fastest")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hetobs-diag-scale-"))
    hetobs = str(VENV_BIN / "hetobs")
    frtrace = str(VENV_BIN / "torchfrtrace")
    rows = []
    try:
        for world in sizes:
            culprit = world // 3
            base = scratch / f"n{world}"
            shutil.rmtree(base, ignore_errors=True)
            t = time.perf_counter()
            with_fr = world <= args.fr_max
            with_pickles = with_fr and world <= args.torch_max
            scratch.mkdir(parents=True, exist_ok=True)
            free_gb = shutil.disk_usage(scratch).free / 2**30
            print(f"# {world} ranks: {free_gb:.0f} GiB free under {scratch}", file=sys.stderr)
            if with_fr:
                write_fr(base / "fr", world, culprit, args.records, with_pickles)
            write_hetobs(base / "jobs", "scale", world, culprit, args.records, args.format)
            gen_s = time.perf_counter() - t
            size_mb = sum(f.stat().st_size for f in base.rglob("*") if f.is_file()) / 2**20
            print(f"# {world} ranks: wrote {size_mb:.0f} MiB of dumps in {gen_s:.1f} s", file=sys.stderr)
            row: dict[str, object] = {"ranks": world}
            if with_pickles:
                wall, rss, rc, _ = best_of(args.repeat, [frtrace, str(base / "fr" / "pickle"), "--prefix",
                                                         "nccl_trace_rank_"], args.timeout)
                row["torchfrtrace"] = (wall, rss, rc == 0)
                wall, rss, rc, out = best_of(args.repeat, [hetobs, "diagnose", "--fr", str(base / "fr" / "pickle"),
                                                           "--json"], args.timeout)
                row["fr_pickle"] = (wall, rss, rc == 1 and names_culprit(out, culprit))
            if with_fr:
                wall, rss, rc, out = best_of(args.repeat, [hetobs, "diagnose", "--fr", str(base / "fr" / "json"),
                                                           "--json"], args.timeout)
                row["fr_json"] = (wall, rss, rc == 1 and names_culprit(out, culprit))
            cmd = [hetobs, "diagnose", "--job", "scale", "--dir", str(base / "jobs"), "--json"]
            wall, rss, rc, out = best_of(args.repeat, cmd, args.timeout)
            row["job"] = (wall, rss, rc == 1 and names_culprit(out, culprit))
            row["job_cpu_s"] = CPU_S[tuple(cmd)]
            row["load_avg"] = os.getloadavg()[0]
            row["size_mb"] = size_mb
            row["job_mb"] = sum(f.stat().st_size for f in (base / "jobs").rglob("*") if f.is_file()) / 2**20
            rows.append(row)
            print(f"# {world}: {json.dumps(row)}", file=sys.stderr)
            shutil.rmtree(base, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    print_table(rows, args.records)
    print(f"\n(best of {args.repeat} runs per cell)")


def _cell(v: Optional[tuple]) -> str:
    if v is None:
        return "–"
    wall, rss, ok = v
    return f"{wall:.2f} s / {rss:.0f} MiB" + ("" if ok else " (WRONG or failed)")


def print_table(rows: list[dict], records: int) -> None:
    print(f"One rank missing the last of {records} all_reduces; best wall time of the runs (CLI start-up "
          f"included) / peak RSS; {os.cpu_count()} cores.\n")
    print("| ranks | torchfrtrace (FR pickle) | hetobs diagnose --fr (FR pickle) | hetobs diagnose --fr (FR JSON) "
          "| hetobs diagnose --job (hetobs dumps) | hetobs job dir | speed-up vs torchfrtrace |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        tf = row.get("torchfrtrace")
        sp = ""
        if tf is not None:
            parts = []
            for key, name in (("fr_pickle", "--fr pickle"), ("fr_json", "--fr JSON"), ("job", "--job")):
                if row.get(key):
                    parts.append(f"{tf[0] / row[key][0]:.0f}x ({name})")
            sp = ", ".join(parts)
        print(f"| {row['ranks']} | {_cell(tf)} | {_cell(row.get('fr_pickle'))} | {_cell(row.get('fr_json'))} "
              f"| {_cell(row.get('job'))}, {row.get('job_cpu_s', 0):.1f} s CPU | {row.get('job_mb', 0):.0f} MiB "
              f"| {sp or '–'} |")


if __name__ == "__main__":
    main()
