#!/usr/bin/env bash
# Set up a fresh machine (Debian 12, root, Python >= 3.10) to build and test hetobs.
#
# Idempotent and quick on a second run: every step first checks whether its result
# is already there. Progress goes to stderr so callers' stdout stays clean (demo.sh
# prints the bandwidth table on stdout).
#
#   bash scripts/setup.sh            # apt packages, .venv, torch (CPU), editable build, the stand-in device
#   HETOBS_REBUILD=1 bash scripts/setup.sh   # force the editable reinstall/rebuild
#   PYTHON=python3.12 bash scripts/setup.sh  # interpreter used to create .venv
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
TORCH_VERSION="2.13.0"

log() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# --- 1. system packages ------------------------------------------------------------
# build-essential cmake ninja-build: the native core; iproute2 iptables: network
# namespaces and link faults in tests; openmpi + prometheus: MPI interposer and
# exporter tests (later issues); chromium (+ a font, not pulled in without recommends): the
# headless-browser test of the HTML report.
APT_PACKAGES=(build-essential cmake ninja-build iproute2 iptables openmpi-bin libopenmpi-dev prometheus chromium
    fonts-liberation)

apt_missing() {
    local pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" == "install ok installed" ]] ||
            printf '%s\n' "$pkg"
    done
}

mapfile -t missing < <(apt_missing)
if ((${#missing[@]})); then
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || die "not root and no sudo: install ${missing[*]} by hand"
        SUDO="sudo"
    fi
    log "apt: installing ${missing[*]} (apt-get update first)"
    apt_log="$(mktemp -t hetobs-apt.XXXXXX)"
    if ! {
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                -o Dpkg::Use-Pty=0 "${missing[@]}"
    } >"$apt_log" 2>&1; then
        tail -n 40 "$apt_log" >&2
        die "apt-get failed (full log: $apt_log)"
    fi
    rm -f "$apt_log"
else
    log "apt: all packages present"
fi

# --- 2. virtual environment --------------------------------------------------------
if [[ ! -x "$VPY" ]]; then
    PY="${PYTHON:-python3}"
    command -v "$PY" >/dev/null || die "no $PY on PATH (set PYTHON=...)"
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PY is older than 3.10"
    log "venv: creating .venv with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
else
    log "venv: .venv present ($("$VPY" --version 2>&1))"
fi
pip() { "$VPY" -m pip "$@" >&2; }

# --- 3. torch first, CPU build ----------------------------------------------------
# Installed before anything else so no later resolve can pull a CUDA build from PyPI.
# Where a local CPU wheel exists (find-links), pin its exact local version: then pip
# cannot pick anything else.
# Checked through package metadata: importing torch takes seconds, metadata does not.
torch_state="$("$VPY" - "$TORCH_VERSION" <<'EOF'
import sys
from importlib import metadata
try:
    version = metadata.version("torch")
except metadata.PackageNotFoundError:
    print("missing")
    sys.exit()
if version.split("+")[0] != sys.argv[1]:
    print("other")
elif any(r.startswith("nvidia-") for r in metadata.requires("torch") or []):
    print("cuda")
else:
    print("ok")
EOF
)"
if [[ "$torch_state" == ok || "$torch_state" == cuda ]]; then
    log "torch: $TORCH_VERSION present"
else
    torch_spec="torch==$TORCH_VERSION"
    for dir in /opt/wheels ${PIP_FIND_LINKS:-}; do
        if compgen -G "$dir/torch-$TORCH_VERSION+cpu-*.whl" >/dev/null 2>&1; then
            torch_spec="torch==$TORCH_VERSION+cpu"
            break
        fi
    done
    log "torch: installing $torch_spec"
    pip install -q "$torch_spec"
fi
if [[ "$torch_state" == cuda ]]; then
    log "warning: the installed torch is a CUDA build; hetobs only needs the CPU one"
fi

# --- 4. build dependencies (system cmake and ninja are used) ------------------------
if "$VPY" -c 'import scikit_build_core, pybind11' 2>/dev/null; then
    log "build deps: present"
else
    log "build deps: installing scikit-build-core pybind11"
    pip install -q "scikit-build-core>=0.10" "pybind11>=2.13"
fi

# --- 5. editable install of hetobs (+ test, telemetry and lint extras) ---------------
# lint: ruff and mypy, which scripts/test.sh runs (their config is in pyproject.toml).
# Reinstall only when something that the build or the editable mapping depends on
# changed: pyproject, the native sources, or the set of Python files (the editable
# finder maps files known at install time). Python edits alone need no reinstall.
stamp_file="$VENV/.hetobs-install-stamp"
stamp="$(
    {
        "$VPY" --version 2>&1
        # hetobs._torch_ext is compiled against the installed torch: a new torch rebuilds.
        "$VPY" -c 'import importlib.metadata as m; print("torch", m.version("torch"))' 2>/dev/null || true
        cat pyproject.toml
        if [[ -d csrc ]]; then find csrc -type f -print0 | sort -z | xargs -0r sha256sum; fi
        # The native settings table is generated from it at build time (csrc/cmake/gen_settings.py).
        sha256sum hetobs/settings_table.py
        find hetobs cli exporters \( -name '*.py' -o -name '*.pyi' \) -print 2>/dev/null | sort || true
    } | sha256sum | cut -d' ' -f1
)"
# install_unless_current WHAT STAMP_FILE STAMP CHECK BUILD...: run BUILD (and then CHECK, which
# must pass) unless STAMP_FILE holds STAMP and CHECK already passes; HETOBS_REBUILD=1 forces it.
install_unless_current() {
    local what="$1" file="$2" want="$3" check="$4"
    shift 4
    if [[ "${HETOBS_REBUILD:-0}" != 1 && -f "$file" && "$(cat "$file")" == "$want" ]] &&
        "$VPY" -c "$check" 2>/dev/null; then
        log "$what: up to date"
        return
    fi
    log "$what: building (editable)"
    rm -f "$file"
    "$@"
    "$VPY" -c "$check" || die "$what does not work after the build (python -c '$check')"
    printf '%s\n' "$want" >"$file"
}

# hetobs._torch_ext (the C++ torch wrapper) is built with the torch installed above: it must import.
install_unless_current "hetobs (build dir build/<wheel tag>)" "$stamp_file" "$stamp" \
    'import hetobs._core, torch, hetobs._torch_ext' pip install -q --no-build-isolation -e '.[test,telemetry,lint]'

# --- 6. the stand-in accelerator (standin/): a torch extension for the tests and benches ----
# A PrivateUse1 device "standin" with its own collective library "sccl" (not a real device:
# standin/hetobs_standin/__init__.py says what it models). Built against the installed torch.
standin_stamp_file="$VENV/.hetobs-standin-stamp"
standin_stamp="$(
    {
        "$VPY" -c 'import importlib.metadata as m; print("torch", m.version("torch"))' 2>/dev/null || true
        find standin csrc/cmake -type f \( -name '*.cc' -o -name '*.h' -o -name '*.txt' -o -name '*.toml' \
            -o -name '*.cmake' -o -name '*.py' \) -print0 | sort -z | xargs -0r sha256sum
    } | sha256sum | cut -d' ' -f1
)"
install_unless_current "stand-in device (build dir build/standin-<wheel tag>)" "$standin_stamp_file" \
    "$standin_stamp" 'import hetobs_standin, torch; torch.ones(1).to("standin")' \
    pip install -q --no-build-isolation --no-deps -e ./standin
log "done"
