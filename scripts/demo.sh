#!/usr/bin/env bash
# The main job: set up (idempotent), then `hetobs demo` — a local 4-rank job on the
# native transport with an injected fault (default: a rank stuck in Python), the
# watchdog's dumps and the diagnosis naming the culprit with its evidence.
# Extra arguments go to `hetobs demo` (e.g. --fault kill|stop|sleep|mismatch|link|deadlock).
# Exit status 0: the diagnosis named exactly the injected fault (or a healthy run healthy).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

exec .venv/bin/hetobs demo "$@"
