#!/usr/bin/env bash
# Every GPU check in one call, for a session lent a GPU machine (the device tool): builds
# hetobs against that machine's torch (a CUDA build; HETOBS_TORCH_EXT=ON builds the C++ torch
# extension for whatever torch version is there), then runs
#   1. tests/nccl/gpu_check.sh          the NCCL interposer and profiler plugin on real NCCL
#   2. tests/nccl/torch_gpu_check.py    the torch wrapper "hetobs_nccl" over real NCCL
#   3. tests/nccl/islands_gpu_check.py  a CUDA island with NCCL inside beside a CPU island (every op,
#                                       dtype and reduction exact), and the relay with stage "cuda"
#                                       and stage "device", pipelined and not, timed
# Each check's output goes to $OUT/<check>.log (and the islands check's JSON to $OUT/islands.json);
# the last lines say which passed. Record the results in docs/islands.md ("On a GPU").
#
#   bash tests/nccl/gpu_all.sh      # the device tool: run(command="OUT=$OUT bash tests/nccl/gpu_all.sh", timeout_s=540)
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/hetobs-gpu-all.XXXXXX)}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
cd "$REPO"
status=()

echo "== build (torch $("$PY" -c 'import torch; print(torch.__version__)' 2>&1))"
if "$PY" -m pip install -q --no-build-isolation --no-deps -e . \
    --config-settings=cmake.define.HETOBS_TORCH_EXT=ON >"$OUT/build.log" 2>&1; then
  status+=("build: ok")
else
  tail -40 "$OUT/build.log"
  status+=("build: FAILED (see build.log)")
  printf '%s\n' "${status[@]}"
  exit 1
fi
"$PY" -c 'import hetobs._torch_ext' >>"$OUT/build.log" 2>&1 && status+=("torch extension: built") ||
  status+=("torch extension: not built (stage device falls back; see build.log)")

run() {  # name, command...
  local name=$1
  shift
  echo "== $name"
  timeout 240 "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -25 "$OUT/$name.log"
  status+=("$name: exit $rc")
}
run nccl_interposer env OUT="$OUT/nccl" PYTHON="$PY" bash tests/nccl/gpu_check.sh
run torch_nccl "$PY" tests/nccl/torch_gpu_check.py
run islands "$PY" tests/nccl/islands_gpu_check.py --device cuda --mib 64 --reps 5
sed -n '/^{/,$p' "$OUT/islands.log" >"$OUT/islands.json"
echo "== summary"
printf '%s\n' "${status[@]}"
