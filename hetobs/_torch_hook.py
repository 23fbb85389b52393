"""Register the torch backends the moment `torch.distributed` is imported, without
importing torch from `import hetobs` (a rank that never uses torch must not pay for it).

A meta-path finder wraps the loader of `torch.distributed`: once the module has run,
`hetobs.torch.register()` is called. If torch.distributed is already imported,
registration happens at once. Failures are logged, never raised: a broken hook must
not break `import torch`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from types import ModuleType
from typing import Any, Sequence

__all__ = ["install"]

_log = logging.getLogger("hetobs")


def _register() -> None:
    pkg = sys.modules.get(f"{__package__}.torch")
    if pkg is not None and not hasattr(pkg, "register"):
        # `import hetobs.torch` first: its own import of torch.distributed lands here while it is
        # half made; it registers the backends itself once it is whole (end of its __init__).
        return
    try:
        from .torch import register

        register()
    except Exception as e:  # never break the importer
        _log.warning("hetobs: could not register the torch.distributed backends: %s", e)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name != "torch.distributed":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    if "torch.distributed" in sys.modules:
        _register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
