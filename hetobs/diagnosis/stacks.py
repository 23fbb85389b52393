"""Where a rank's Python is: the innermost frame of its main thread, from faulthandler text.

Dumps carry `python.stacks` as faulthandler prints it::

    Thread 0x7f.. (most recent call first):
      File "/x/train.py", line 42 in step
      File "/x/train.py", line 90 in <module>

The diagnosis only needs one line per rank ("in sleep at train.py:42"), so the text is
reduced to that as soon as the dump is read. The main thread is the one whose
outermost frame is `<module>`; the watchdog and side-channel threads (native, or
Python helpers) rarely are.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Optional

__all__ = ["innermost_frame"]

_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+", re.M)
_FRAME = re.compile(r'^\s*File "([^"]*)", line (\d+) in (\S+)', re.M)


def innermost_frame(stacks: object) -> Optional[str]:
    """`"func at file:line"` for the main thread's innermost frame, or None."""
    if not isinstance(stacks, str) or not stacks:
        return None
    starts = [m.start() for m in _THREAD.finditer(stacks)] or [0]
    blocks = [stacks[a:b] for a, b in pairwise(starts + [len(stacks)])]
    best: Optional[list[tuple[str, str, str]]] = None
    for block in blocks:
        frames = _FRAME.findall(block)
        if not frames:
            continue
        if frames[-1][2] == "<module>":
            best = frames
            break
        if best is None:
            best = frames
    if not best:
        return None
    path, line, func = best[0]
    return f"{func} at {path.rsplit('/', 1)[-1]}:{line}"
