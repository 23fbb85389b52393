#!/usr/bin/env bash
# The main job for now: set up (idempotent), then a local 4-rank run of the native
# transport that prints the bandwidth table. Extra arguments go to `hetobs bench`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

exec .venv/bin/hetobs bench --ranks 4 --quick "$@"
