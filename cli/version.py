"""`hetobs version [--json]`: package, native core and build versions.

The first thing to ask for when an install misbehaves, so it must answer even when
the native core does not load: it then still prints what it knows, names the
import error on stderr and exits INTERNAL (4). A core whose version differs from
the Python package's (a stale build) is also INTERNAL.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import platform
from typing import Annotated, Any

import typer

import hetobs

from ._exit_codes import ExitCode
from ._output import Output

__all__ = ["app", "collect"]

# subcommand_metavar="": a command, not a group, so help shows no "COMMAND [ARGS]...".
app = typer.Typer(add_completion=False, subcommand_metavar="")


def _core_info() -> tuple[dict[str, Any] | None, str | None]:
    """(core description, None) or (None, why it failed to load)."""
    try:
        core = importlib.import_module("hetobs._core")
    except Exception as exc:  # any failure to load is reported, not raised
        return None, f"{type(exc).__name__}: {exc}"
    try:
        build = dict(getattr(core, "build_info", dict)())
    except Exception as exc:
        build = {"error": f"build_info() failed: {type(exc).__name__}: {exc}"}
    abi = getattr(core, "ABI_VERSION", None)
    if abi is None:
        abi = build.get("abi")
    info = {
        "version": getattr(core, "__version__", None),
        "abi": abi,
        "path": getattr(core, "__file__", None),
        "build": build,
    }
    return info, None


def _dist_version(name: str) -> str | None:
    # Metadata only: `hetobs version` must not import torch.
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_path(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    return spec.origin if spec is not None else None


def collect() -> tuple[dict[str, Any], list[str]]:
    """Everything `hetobs version` reports, and the problems found (empty when healthy)."""
    core, error = _core_info()
    problems: list[str] = []
    if error is not None:
        problems.append(f"the native core hetobs._core failed to load: {error} (rebuild: bash scripts/setup.sh)")
    elif isinstance(core, dict) and isinstance(core["version"], str) and core["version"] != hetobs.__version__:
        problems.append(f"version skew: hetobs {hetobs.__version__} but native core {core['version']} "
                        "(stale build? rebuild: bash scripts/setup.sh)")
    info: dict[str, Any] = {
        "hetobs": hetobs.__version__,
        "core": core,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _dist_version("torch"),
        # Located, not imported (that would load torch): the C++ torch wrapper, or None
        # when hetobs was built without torch (the wrappers then run in Python).
        "torch_ext": _module_path("hetobs._torch_ext"),
    }
    if error is not None:
        info["core_error"] = error
    return info, problems


@app.callback(invoke_without_command=True)
def version(
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Show the hetobs version, the native core's version/ABI and how it was built."""
    out = Output(json_mode=json_)
    info, problems = collect()
    out.result(info)
    for problem in problems:
        out.error(problem)
    if problems:
        raise typer.Exit(int(ExitCode.INTERNAL))
