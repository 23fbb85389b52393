#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite; arguments go to pytest.
#
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -m "not slow"   # skip the multi-process / wheel-building tests
#   bash scripts/test.sh tests/test_cli_version.py -x
#   SANITIZE=0 bash scripts/test.sh      # everything but the sanitizer builds (scripts/sanitize.sh)
#
# pytest's exit code 5 ("no tests collected") counts as a failure: a suite that ran
# nothing must never look green.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

# The native tests under ThreadSanitizer and AddressSanitizer+UBSan (scripts/sanitize.sh): with
# the whole suite and in CI, not when a few tests are picked; SANITIZE=0 skips, SANITIZE=1 forces.
if [[ "${SANITIZE:-}" == 1 || ( "${SANITIZE:-}" != 0 && ( $# -eq 0 || "${CI:-}" == true ) ) ]]; then
    bash scripts/sanitize.sh
fi

rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "test.sh: pytest collected no tests; treating that as a failure" >&2
    exit 1
fi
exit "$rc"
