"""Where the LD_PRELOAD libraries are, and the environment that loads them.

The interposers (`libhetobs_mpi.so`, `libhetobs_nccl.so`) are installed inside the
package, in `hetobs/lib/`. In a wheel that is next to this file; in scikit-build-core's
editable install the built targets go to site-packages/hetobs/lib/ while the Python
sources stay in the checkout, and `hetobs.__path__` lists both, so every directory of
the package is searched.

This module imports nothing native: it works when hetobs._core does not load.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

__all__ = ["LIBRARIES", "library_path", "preload_env", "preload_value", "search_dirs"]

LIBRARIES = {"mpi": "libhetobs_mpi.so", "nccl": "libhetobs_nccl.so"}


def search_dirs() -> list[str]:
    """The `lib/` directories looked in, in order (every directory of the hetobs package)."""
    dirs: list[str] = []
    try:
        from importlib import resources

        root = resources.files("hetobs")
        # A plain directory, or a MultiplexedPath over several (editable installs).
        paths = getattr(root, "_paths", None) or [root]
        for p in paths:
            d = os.path.join(str(p), "lib")
            if os.path.basename(str(p)) == "hetobs" and d not in dirs:
                dirs.append(d)
    except (ImportError, TypeError, ValueError, AttributeError):
        pass  # importlib.resources cannot see the package: hetobs.__path__ below still can
    import hetobs

    for p in list(getattr(hetobs, "__path__", [])) + [os.path.dirname(os.path.abspath(__file__))]:
        d = os.path.join(os.path.abspath(p), "lib")
        # The editable finder also lists the checkout's root; only directories of the package count.
        if os.path.basename(os.path.abspath(p)) == "hetobs" and d not in dirs:
            dirs.append(d)
    return dirs


def library_path(kind: str) -> str:
    """Absolute path of libhetobs_<kind>.so (`kind`: "mpi" or "nccl").

    Raises ValueError for an unknown kind and FileNotFoundError, naming where it looked
    and why it may be missing, when the library is not installed.
    """
    try:
        name = LIBRARIES[kind]
    except KeyError:
        raise ValueError(f"{kind!r}: expected one of {', '.join(LIBRARIES)}") from None
    dirs = search_dirs()
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path):
            return os.path.realpath(path)
    why = {"mpi": "it is built only when CMake finds an MPI (mpicc; Debian: openmpi-bin libopenmpi-dev) "
                  "at install time: install one, then reinstall hetobs",
           "nccl": "it is built with the native core: reinstall hetobs"}[kind]
    raise FileNotFoundError(f"{name} is not installed (looked in {', '.join(dirs)}); {why}")


def preload_value(kinds: Iterable[str], existing: str | None = None) -> str:
    """An LD_PRELOAD value loading the given interposers first, then whatever `existing` held."""
    ours = [library_path(k) for k in kinds]
    rest = [p for p in (existing or "").replace(" ", ":").split(":") if p and p not in ours]
    return ":".join(ours + rest)


def preload_env(kinds: Iterable[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: os.environ) with LD_PRELOAD loading the given interposers."""
    out = dict(os.environ if env is None else env)
    out["LD_PRELOAD"] = preload_value(kinds, out.get("LD_PRELOAD"))
    return out
