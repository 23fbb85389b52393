#!/usr/bin/env bash
# The full all_reduce table (8 B .. 64 MiB) for 2 and 4 ranks: hetobs-shm, hetobs-tcp and
# Gloo interleaved in one run each. Tables and JSON rows go to bench/out/ (gitignored);
# the tables are also shown on stdout, progress on stderr.
#
#   bash bench/allreduce.sh                       # both rank counts, default 5 reps
#   bash bench/allreduce.sh --reps 9              # extra arguments go to `hetobs bench`
#   RANKS="2" bash bench/allreduce.sh --quick     # just 2 ranks, the demo sizes
#   OP=all_gather bash bench/allreduce.sh         # another collective, same layout
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/bench/out"
HETOBS="${HETOBS:-}"
if [[ -z "$HETOBS" ]]; then
    if [[ -x "$ROOT/.venv/bin/hetobs" ]]; then
        HETOBS="$ROOT/.venv/bin/hetobs"
    elif command -v hetobs >/dev/null 2>&1; then
        HETOBS="$(command -v hetobs)"
    else
        echo "allreduce.sh: no hetobs command (run: bash scripts/setup.sh, or set HETOBS=...)" >&2
        exit 2
    fi
fi
OP="${OP:-all_reduce}"
RANKS="${RANKS:-2 4}"
mkdir -p "$OUT"

status=0
for n in $RANKS; do
    base="$OUT/$OP-n$n"
    echo "allreduce.sh: $OP, $n ranks -> $base.txt, $base.json" >&2
    # the table is kept even when a backend fails (the command then exits non-zero)
    COLUMNS=200 "$HETOBS" bench --op "$OP" --ranks "$n" --save "$base.json" "$@" | tee "$base.txt" \
        || status=$?
done
exit "$status"
