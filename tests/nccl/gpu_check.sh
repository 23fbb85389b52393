#!/usr/bin/env bash
# Real-GPU check of libhetobs_nccl.so (the NCCL interposer and profiler plugin), for a
# machine with a GPU, NCCL and the CUDA runtime. Everything in tests/test_nccl_interposer.py
# runs against stand-ins; this runs the real thing and prints what hetobs recorded.
#
#   bash tests/nccl/gpu_check.sh            # NRANKS ranks (default: 2 if there are 2+ GPUs, else 1)
#
# Builds tests/nccl/gpu_app.c against the system's nccl.h/libnccl and cuda_runtime.h/
# libcudart, runs it with LD_PRELOAD=libhetobs_nccl.so and NCCL_PROFILER_PLUGIN=<same
# library>, and checks: every op recorded (names, counts, backend nccl, device cuda, GPU
# durations), the op held in flight behind a sleeping host function seen by the watchdog
# (a hang dump with HETOBS_HANG_TIMEOUT=2), NCCL loading the profiler plugin, and a clean
# exit. With 2 ranks the network transport is forced (NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1)
# so NCCL's proxy runs and the per-peer progress counters can be checked too.
#
# Finding things (override with the variables):
#   HETOBS_NCCL_LIB  the library; else build/*/libhetobs_nccl.so, else `hetobs preload-path
#                    nccl`, else it is built here with cmake (needs pybind11 for the configure)
#   CUDA_HOME        else the directory of nvcc, else /usr/local/cuda
#   NCCL_HOME        else /usr, else the nvidia-nccl-cu* Python wheel
#   OUT              working directory (default: a new temp directory); everything is kept there
# Exit status: 0 all checks passed, 1 a check failed, 2 something needed is missing.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/hetobs-gpu-check.XXXXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-}
[ -z "$PY" ] && [ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
[ -z "$PY" ] && PY=$(command -v python3 || true)
say() { printf '%s\n' "$*"; }
missing() { say "MISSING: $*"; exit 2; }

command -v nvidia-smi >/dev/null && nvidia-smi -L || say "(no nvidia-smi)"

# --- the library -------------------------------------------------------------------
LIB=${HETOBS_NCCL_LIB:-}
if [ -z "$LIB" ]; then LIB=$(ls -t "$REPO"/build/*/libhetobs_nccl.so 2>/dev/null | head -1); fi
if [ -z "$LIB" ] && [ -n "$PY" ]; then LIB=$(PYTHONPATH=$REPO "$PY" -m hetobs.cli preload-path nccl 2>/dev/null || true); fi
if [ -z "$LIB" ]; then
  say "building libhetobs_nccl.so in $OUT/build"
  PYBIND=$("$PY" -m pybind11 --cmakedir 2>/dev/null) || missing "pybind11 (pip install pybind11) to configure csrc/"
  cmake -S "$REPO/csrc" -B "$OUT/build" -DPython_EXECUTABLE="$PY" -Dpybind11_DIR="$PYBIND" \
    -DSKBUILD_PROJECT_NAME=hetobs -DSKBUILD_PROJECT_VERSION=0.0.0 >"$OUT/cmake.log" 2>&1 &&
    cmake --build "$OUT/build" --target hetobs_nccl -j 8 >>"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; missing "a build of hetobs_nccl"; }
  LIB=$OUT/build/libhetobs_nccl.so
fi
[ -f "$LIB" ] || missing "libhetobs_nccl.so ($LIB)"
LIB=$(readlink -f "$LIB")
say "library: $LIB"

# --- CUDA and NCCL -----------------------------------------------------------------
CUDA_HOME=${CUDA_HOME:-}
[ -z "$CUDA_HOME" ] && command -v nvcc >/dev/null && CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CUDA_INC=$CUDA_HOME/include
CUDA_LIB=$( (ls -d "$CUDA_HOME"/lib64 "$CUDA_HOME"/lib "$CUDA_HOME"/targets/*/lib 2>/dev/null) | while read -r d; do
  [ -e "$d/libcudart.so" ] && echo "$d" && break; done)
[ -f "$CUDA_INC/cuda_runtime.h" ] || missing "cuda_runtime.h (set CUDA_HOME)"
[ -n "$CUDA_LIB" ] || missing "libcudart.so under $CUDA_HOME (set CUDA_HOME)"

NCCL_HOME=${NCCL_HOME:-}
if [ -z "$NCCL_HOME" ]; then
  for d in /usr /usr/local /usr/local/nccl /opt/nccl; do
    [ -f "$d/include/nccl.h" ] && NCCL_HOME=$d && break
  done
fi
if [ -z "$NCCL_HOME" ] && [ -n "$PY" ]; then
  NCCL_HOME=$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
fi
[ -n "$NCCL_HOME" ] && [ -f "$NCCL_HOME/include/nccl.h" ] || missing "nccl.h (set NCCL_HOME)"
NCCL_LIB=$( (ls -d "$NCCL_HOME"/lib64 "$NCCL_HOME"/lib "$NCCL_HOME"/lib/x86_64-linux-gnu "$NCCL_HOME"/lib/aarch64-linux-gnu 2>/dev/null) | while read -r d; do
  [ -e "$d/libnccl.so.2" ] && echo "$d" && break; done)
[ -n "$NCCL_LIB" ] || missing "libnccl.so.2 under $NCCL_HOME"
say "CUDA: $CUDA_HOME  NCCL: $NCCL_HOME ($(grep -m1 -E 'define NCCL_VERSION_CODE|NCCL_MAJOR' "$NCCL_HOME/include/nccl.h" | tr -s ' '))"

cc -O1 -Wall -o "$OUT/gpu_app" "$REPO/tests/nccl/gpu_app.c" -I"$CUDA_INC" -I"$NCCL_HOME/include" \
  -L"$NCCL_LIB" -L"$CUDA_LIB" -l:libnccl.so.2 -lcudart -Wl,-rpath,"$NCCL_LIB:$CUDA_LIB" || missing "a build of gpu_app.c"

# --- run -----------------------------------------------------------------------------
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "${NGPU:-0}" -ge 1 ] 2>/dev/null || NGPU=1
NRANKS=${NRANKS:-$([ "$NGPU" -ge 2 ] && echo 2 || echo 1)}
JOB=gpucheck$$
export HETOBS_DIR=$OUT/jobs HETOBS_JOB_ID=$JOB HETOBS_HANG_TIMEOUT=2 HETOBS_DEBUG=INFO WORLD_SIZE=$NRANKS
export NCCL_PROFILER_PLUGIN=$LIB NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE=$OUT/nccl-%p.log
if [ "$NRANKS" -gt 1 ]; then  # one host: force NCCL's network proxy (IB if present, else sockets over lo)
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
fi
rm -f "$OUT/id"
pids=()
for ((r = 0; r < NRANKS; r++)); do
  RANK=$r LD_PRELOAD=$LIB "$OUT/gpu_app" "$r" "$NRANKS" "$OUT/id" >"$OUT/rank$r.out" 2>"$OUT/rank$r.err" &
  pids+=($!)
done
# While the last op is held in flight: read the live stats segments from outside.
for _ in $(seq 1 300); do
  n=0; for ((r = 0; r < NRANKS; r++)); do grep -q INFLIGHT "$OUT/rank$r.out" 2>/dev/null && n=$((n + 1)); done
  [ $n -eq "$NRANKS" ] && break; sleep 0.1
done
sleep 1
if [ -n "$PY" ]; then
  for ((r = 0; r < NRANKS; r++)); do
    PYTHONPATH=$REPO "$PY" - "$JOB" "$r" >"$OUT/live$r.json" 2>&1 <<'EOF'
import json, sys
from hetobs.stats import read_segment
s = read_segment(f"/dev/shm/hetobs-stats-{sys.argv[1]}-r{sys.argv[2]}", records=64)
print(json.dumps({"records": s.records, "comms": [c.__dict__ | {"ops": {k: v.calls for k, v in c.ops.items()}} for c in s.comms],
                  "links": [l.__dict__ for l in s.links]}, default=str))
EOF
  done
fi
status=0
for ((r = 0; r < NRANKS; r++)); do wait "${pids[$r]}" || status=1; done

# --- report and checks ---------------------------------------------------------------
fail=0
check() { if eval "$2"; then say "PASS  $1"; else say "FAIL  $1"; fail=1; fi; }
for ((r = 0; r < NRANKS; r++)); do say "--- rank $r stdout"; cat "$OUT/rank$r.out"; say "--- rank $r stderr"
  head -20 "$OUT/rank$r.err"; done
say "--- NCCL log lines about the profiler"
grep -hiE 'NCCL version|profiler' "$OUT"/nccl-*.log 2>/dev/null | head -20
check "gpu_app exited 0 on every rank" "[ $status -eq 0 ]"
check "NCCL loaded the hetobs profiler plugin" "grep -qiE 'profiler.*(hetobs|libhetobs_nccl)' $OUT/nccl-*.log"
if [ -n "$PY" ]; then
  PYTHONPATH=$REPO "$PY" - "$OUT" "$JOB" "$NRANKS" <<'EOF' || fail=1
import glob, json, os, sys
out, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ok = True
def check(what, cond, detail=""):
    global ok
    print(("PASS  " if cond else "FAIL  ") + what + (f"   [{detail}]" if detail and not cond else ""))
    ok = ok and bool(cond)
expect = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send", "recv"] + ["all_reduce"] * 11
jobdir = os.path.join(out, "jobs", job)
for r in range(n):
    try:
        live = json.load(open(os.path.join(out, f"live{r}.json")))
    except Exception as e:
        check(f"rank {r}: stats segment read while the last op was in flight", False, repr(e)); continue
    recs = live["records"]
    print(f"rank {r} records (live):")
    for x in recs:
        dur = (x["time_discovered_completed_ns"] or 0) - (x["time_discovered_started_ns"] or 0)
        print(f"  {x['record_id']:3} {x['op']:15} count {x['count']:>9} out {x['out_count']:>9} {x['dtype']:9} "
              f"{x['state']:9} {dur/1e6 if x['state']=='completed' else 0:9.3f} ms  busbw {x['busbw_gbps']:8.2f} GB/s")
    check(f"rank {r}: every op recorded in order", [x["op"] for x in recs] == expect, [x["op"] for x in recs])
    check(f"rank {r}: all but the held op completed, with GPU durations",
          all(x["state"] == "completed" and x["time_discovered_completed_ns"] > x["time_discovered_started_ns"]
              for x in recs[:-1]))
    check(f"rank {r}: the held op is in flight (the host did not wait; the watchdog sees it)",
          recs and recs[-1]["state"] == "started")
    if n > 1:
        print(f"rank {r} links (live): " + json.dumps(live["links"]))
        check(f"rank {r}: per-peer proxy progress recorded (steps sent and received)",
              any(l["progress"]["send_sent"] > 0 and l["progress"]["recv_received"] > 0 for l in live["links"]))
hangs = sorted(glob.glob(os.path.join(jobdir, "incidents", "hang-*", "rank-0.json")))
check("a hang dump for the held op (HETOBS_HANG_TIMEOUT=2)", hangs, os.listdir(os.path.join(jobdir, "incidents")) if os.path.isdir(os.path.join(jobdir, "incidents")) else "no incidents")
if hangs:
    d = json.load(open(hangs[0]))
    c = [c for c in d["comms"] if c.get("backend") == "nccl"]
    f = c[0]["in_flight"] if c else None
    print("hang dump in_flight: " + json.dumps(f))
    check("hang dump names the in-flight allreduce", f and f["op"] == "all_reduce")
    e = [x for x in d["entries"] if x["backend"] == "nccl"]
    check("dump entries say backend nccl, device cuda", e and all(x["device_type"] == "cuda" for x in e))
for r in range(n):
    meta = json.load(open(os.path.join(jobdir, "ranks", f"rank-{r}.json")))
    check(f"rank {r}: exited cleanly", meta.get("exited_cleanly") is True)
sys.exit(0 if ok else 1)
EOF
else
  say "(no python: records not checked; see $HETOBS_DIR/$JOB)"; ls -R "$HETOBS_DIR/$JOB"
fi
say "everything is in $OUT"
[ $fail -eq 0 ] && say "GPU CHECK: PASS" || say "GPU CHECK: FAIL"
exit $fail
