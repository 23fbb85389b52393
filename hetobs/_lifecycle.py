"""Process-level hooks installed once by `hetobs.init()`.

- Python stacks for dumps: faulthandler is registered on a private real-time signal,
  writing into an unlinked temp file. The native watchdog raises the signal and reads
  the file, so it gets every thread's stack without ever taking the GIL, even while
  the main thread is stuck in a collective or spinning in pure Python.
- Exit: at interpreter exit the rank's metadata is marked `exited_cleanly` (unless an
  exception escaped to the top) and its stats segment is removed. atexit cannot see
  the exit status (`sys.exit(1)` runs it like a clean exit does), so the native
  runtime also records the status exit() is given (`exit_status.code`) and takes back
  the clean mark when it is not 0. A fatal signal runs neither: the mark stays false,
  and the native signal recorder (csrc/src/observe/exit_signal.cc) writes the signal.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import tempfile
from types import TracebackType
from typing import IO

__all__ = ["install", "STACK_SIGNAL"]

# A real-time signal nobody else is likely to use; faulthandler's handler is C-level.
STACK_SIGNAL = int(signal.SIGRTMIN) + 7

_installed = False
_stack_file: IO[bytes] | None = None
_crashed = False


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    global _crashed
    _crashed = True
    _previous_hook(kind, value, tb)


_previous_hook = sys.excepthook


def _on_exit() -> None:
    from . import _core

    try:
        _core.mark_exit(not _crashed)
    except Exception:  # telemetry never turns an exit into a crash
        pass


def install() -> None:
    """Idempotent: the first call wires stacks and exit handling.

    Later calls hand the stack file to a runtime that started since (a rank whose job id
    is agreed at rendezvous starts its runtime only then).
    """
    global _installed, _stack_file, _previous_hook
    if _installed:
        if _stack_file is not None:
            from . import _core

            _core.set_stack_dumper(STACK_SIGNAL, _stack_file.fileno())
        return
    _installed = True
    from . import _core

    try:
        fd, path = tempfile.mkstemp(prefix="hetobs-stacks-")
        os.unlink(path)  # nothing left behind; the fd is all we need
        _stack_file = os.fdopen(fd, "w+b", buffering=0)
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
        _core.set_stack_dumper(STACK_SIGNAL, fd)
    except (OSError, RuntimeError, ValueError):
        _stack_file = None  # dumps then say python.status = "unavailable"
    _previous_hook = sys.excepthook
    sys.excepthook = _excepthook
    atexit.register(_on_exit)
