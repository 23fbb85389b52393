#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite; arguments go to pytest.
#
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -m "not slow"   # skip the multi-process / wheel-building tests
#   bash scripts/test.sh tests/test_cli_version.py -x
#   SANITIZE=0 bash scripts/test.sh      # everything but the sanitizer builds (scripts/sanitize.sh)
#   LINT=0 bash scripts/test.sh          # everything but ruff and mypy
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

# Lint and types on the package, the CLI and the exporters (config in pyproject.toml): with the
# whole suite and in CI, as the sanitizers; LINT=0 skips, LINT=1 forces. A finding fails the run
# (after pytest, so one run shows both).
lint_rc=0
if [[ "${LINT:-}" == 1 || ( "${LINT:-}" != 0 && ( $# -eq 0 || "${CI:-}" == true ) ) ]]; then
    .venv/bin/python -m ruff check hetobs cli exporters || lint_rc=1
    .venv/bin/python -m mypy || lint_rc=1
fi

rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "test.sh: pytest collected no tests; treating that as a failure" >&2
    exit 1
fi
if [[ $rc -eq 0 && $lint_rc -ne 0 ]]; then
    echo "test.sh: ruff or mypy found problems (above); treating that as a failure" >&2
    exit 1
fi
exit "$rc"
