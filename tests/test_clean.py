"""`hetobs clean` removes what killed ranks left, never a live rank's (issue 13 item 6).

Everything runs in a private mount namespace with its own /dev/shm and its own control
socket directory (/tmp/hetobs-<uid>), so the developers and tests sharing this machine
neither disturb nor are disturbed by what is cleaned; both go with the namespace.
Needs root (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="a private /dev/shm needs root and util-linux's unshare")]

TESTS = Path(__file__).resolve().parent
SOCK_DIR = f"/tmp/hetobs-{os.getuid()}"
PRIVATE = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
           f'mount -t tmpfs tmpfs /dev/shm && mkdir -p {SOCK_DIR} && '
           f'mount -t tmpfs -o mode=0700 tmpfs {SOCK_DIR} && exec "$@"', "sh"]

# A rank that joins, runs an op, says READY and then waits for its stdin to close.
RANK = """
import sys, numpy as np, hetobs
comm = hetobs.init()
comm.all_reduce(np.ones(10, np.float32))
print("READY", flush=True)
sys.stdin.read()
"""

# Runs inside the namespace: two jobs, one of them killed with SIGKILL, then `hetobs clean`.
DRIVER = r"""
import hashlib, json, os, signal, subprocess, sys
sys.path.insert(0, TESTS)
from _launch import free_port
from hetobs import stats

def start(job, world, tmp):
    port, procs = str(free_port()), []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   HETOBS_JOB_ID=job, HETOBS_DIR=tmp, HETOBS_TRANSPORT="shm", HETOBS_CONNECT_TIMEOUT="20")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True))
    for p in procs:
        assert p.stdout.readline().strip() == "READY"
    return procs

def entries():
    out = sorted("/dev/shm/" + n for n in os.listdir("/dev/shm"))
    return out + sorted(os.path.join(SOCK_DIR, n) for n in os.listdir(SOCK_DIR))

def clean(*args):
    p = subprocess.run([sys.executable, "-m", "hetobs.cli", "clean", "--json", *args], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)

live = start("live-job", 2, TMP)
before = entries()
dead = start("dead-job", 2, TMP)
with_dead = entries()
for p in dead:
    p.send_signal(signal.SIGKILL)
    p.wait()
left = entries()
from hetobs.clean import clean as clean_lib  # as the suite's conftest calls it, on what appeared
among = [x.path for x in clean_lib(dry_run=True, among={"hetobs-stats-dead-job-r0", "hetobs-stats-live-job-r0"}).removed]
dry = clean("--dry-run")
after_dry = entries()
done = clean()
after = entries()
again = clean()
# A restarted rank replaces its dead predecessor's segment and socket.
pred = start("restart-job", 1, TMP)
pred[0].send_signal(signal.SIGKILL)
pred[0].wait()
mine = ("hetobs-stats-restart-job-r0", hashlib.sha256(b"restart-job").hexdigest()[:12] + "-r0.sock")
stale = [e for e in entries() if e.endswith(mine)]
stale_pid = stats.read_segment("/dev/shm/hetobs-stats-restart-job-r0").pid
succ = start("restart-job", 1, TMP)
fresh = [e for e in entries() if e.endswith(mine)]
fresh_pid = stats.read_segment("/dev/shm/hetobs-stats-restart-job-r0").pid
still_live = entries()
for p in live + succ:
    p.stdin.close()
    p.wait(timeout=30)
print(json.dumps(dict(before=before, with_dead=with_dead, left=left, dry=dry, after_dry=after_dry, done=done,
                      after=after, again=again, among=among, stale=stale, fresh=fresh, still_live=still_live,
                      pids=[p.pid for p in pred + succ], stale_pid=stale_pid, fresh_pid=fresh_pid,
                      live_rc=[p.returncode for p in live + succ])))
"""


def test_clean_removes_exactly_the_killed_ranks_leftovers(tmp_path: Path) -> None:
    code = f"TESTS = {str(TESTS)!r}\nTMP = {str(tmp_path)!r}\nSOCK_DIR = {SOCK_DIR!r}\nRANK = {RANK!r}\n" + DRIVER
    p = subprocess.run([*PRIVATE, sys.executable, "-c", code], capture_output=True, text=True, timeout=150,
                       start_new_session=True)
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    dead_only = sorted(set(r["with_dead"]) - set(r["before"]))
    # Each dead rank left its stats segment and its control socket (transport segments are
    # unlinked as soon as the peers map them).
    assert len([e for e in dead_only if "hetobs-stats-dead-job" in e]) == 2, dead_only
    assert len([e for e in dead_only if e.endswith(".sock")]) == 2, dead_only
    assert r["left"] == r["with_dead"]
    assert sorted(x["path"] for x in r["dry"]["removed"]) == dead_only and r["dry"]["dry_run"]
    assert r["after_dry"] == r["left"], "a dry run removes nothing"
    assert r["among"] == ["/dev/shm/hetobs-stats-dead-job-r0"], "only the names given, only the dead"
    assert sorted(x["path"] for x in r["done"]["removed"]) == dead_only
    assert r["done"]["count"] == 4 and r["done"]["bytes"] > 0
    assert all("gone" in x["why"] or "nothing listens" in x["why"] for x in r["done"]["removed"])
    assert r["after"] == r["before"], "the live job's segments and sockets stay"
    assert r["again"]["count"] == 0 and r["again"]["kept"] == len(r["before"])
    assert r["live_rc"] == [0, 0, 0]
    # The restarted rank: one segment and one socket, now its own.
    assert len(r["stale"]) == 2 and r["fresh"] == r["stale"], (r["stale"], r["fresh"])
    assert r["stale_pid"] == r["pids"][0] and r["fresh_pid"] == r["pids"][1]
