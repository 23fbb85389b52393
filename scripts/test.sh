#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite; arguments go to pytest.
#
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -m "not slow"   # skip the multi-process / wheel-building tests
#   bash scripts/test.sh tests/test_cli_version.py -x
#
# pytest's exit code 5 ("no tests collected") counts as a failure: a suite that ran
# nothing must never look green.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "test.sh: pytest collected no tests; treating that as a failure" >&2
    exit 1
fi
exit "$rc"
