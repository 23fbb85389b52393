#!/usr/bin/env bash
# Issue 15's table: hetobs (shm, tcp), Gloo and Open MPI (mpi4py, default binding), interleaved
# in ONE run per (op, ranks), for all_reduce, all_gather, reduce_scatter and broadcast at 2
# and 4 ranks. Tables and JSON rows go to bench/out/ (gitignored), one pair per run; the
# load average before and after each run goes into the table file (the machine may be shared).
#
#   bash bench/vs_ompi.sh                                   # 8 B .. 64 MiB, 5 reps
#   OPS="all_reduce" RANKS="2" bash bench/vs_ompi.sh --reps 9
#   SIZES=8,4K,64K,1M bash bench/vs_ompi.sh                 # latency/mid sizes only
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/bench/out"
HETOBS="${HETOBS:-$ROOT/.venv/bin/hetobs}"
OPS="${OPS:-all_reduce all_gather reduce_scatter broadcast}"
RANKS="${RANKS:-2 4}"
SIZES="${SIZES:-8,4K,16K,64K,256K,1M,4M,16M,64M}"
BACKENDS="${BACKENDS:-hetobs-shm,hetobs-tcp,gloo,ompi}"
mkdir -p "$OUT"

status=0
for op in $OPS; do
    for n in $RANKS; do
        base="$OUT/vs-ompi-$op-n$n"
        echo "vs_ompi.sh: $op, $n ranks -> $base.txt" >&2
        {
            echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
            COLUMNS=220 "$HETOBS" bench --op "$op" --ranks "$n" --sizes "$SIZES" --backends "$BACKENDS" \
                --save "$base.json" "$@" || status=$?
            echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
        } > "$base.txt"
    done
done
exit "$status"
