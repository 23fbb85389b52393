#!/usr/bin/env bash
# Build csrc/tests (hetobs_native_tests: HMAC known answers, recorder ring wrap, communicator
# close against dumps, reconnect probes, shm single copy, doorbell, shm mail slots and push, relay drain, the TSC clock) under ThreadSanitizer and under AddressSanitizer + UBSan, and run it.
# Any sanitizer report fails the run. No Python needed; scripts/test.sh calls this first.
#
#   bash scripts/sanitize.sh                 # both
#   bash scripts/sanitize.sh thread          # one of: thread, address
#   JOBS=4 bash scripts/sanitize.sh          # parallel compile jobs (default: all cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { printf 'sanitize: %s\n' "$*" >&2; }

kinds=("$@")
((${#kinds[@]})) || kinds=(thread address)
jobs="${JOBS:-$(nproc)}"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

for kind in "${kinds[@]}"; do
    case "$kind" in thread | address) ;; *) log "unknown sanitizer '$kind' (thread or address)"; exit 2 ;; esac
    dir="build/sanitize-$kind"
    start=$SECONDS
    # Build type None: no -O2/-g of its own (the sanitizer options bring -O1 -g1).
    cmake -S csrc -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=None -DHETOBS_PYTHON=OFF \
        -DHETOBS_NATIVE_TESTS=ON -DHETOBS_SANITIZE="$kind" >"$dir.configure.log" 2>&1 ||
        { mkdir -p "$(dirname "$dir")"; cat "$dir.configure.log" >&2; exit 1; }
    cmake --build "$dir" --target hetobs_native_tests -j "$jobs" >"$dir.build.log" 2>&1 ||
        { tail -n 60 "$dir.build.log" >&2; log "$kind build failed (log: $dir.build.log)"; exit 1; }
    log "$kind: built in $((SECONDS - start)) s"
    # halt_on_error / exitcode: a report is a failure, never a line scrolled past.
    TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" \
        ASAN_OPTIONS="halt_on_error=1 exitcode=66 detect_leaks=1" \
        UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1" \
        "$dir/hetobs_native_tests" || { log "$kind: native tests FAILED"; exit 1; }
    log "$kind: native tests passed ($((SECONDS - start)) s with the build)"
done
