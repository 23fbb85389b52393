"""Error causes -> root cause, so cascades are blamed on their origin, never on neighbours.

When one rank fails, its peers fail too: "rank 2 (host h, pid 7) closed its connection",
or "aborted by rank 1 (...): <root cause>" (the native core forwards the root cause
unchanged, so chains never grow). Each failure becomes a `Cause`: what kind of failure
it is at its root and which rank(s) it names as culprits. The messenger of an abort
notice is never a culprit.

Dumps of schema 1.1 carry the native abort notice as data (`comms[].abort`: kind,
reporter, suspect, received_from, the vote's deviants): `cause_from_abort` reads it,
and the text is only quoted. Older dumps (tests/data, other writers) have only the
text: `parse_cause` reads it with patterns that follow the native core's messages
(csrc/src/comm/progress.cc, transport/*/channel.cc); unknown text becomes kind
"other" with no culprit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .summary import AbortInfo

__all__ = ["Cause", "parse_cause", "cause_from_abort", "waited_on", "op_and_seq"]

_CONTEXT = re.compile(r"^.*? on comm \d+ failed at rank \d+: ")
_ABORTED = re.compile(r"aborted by rank (\d+)(?: \([^)]*\))?: ")
_RANK_FAILED = re.compile(r"^rank (\d+) failed: ")
_RANK_TIMED_OUT = re.compile(r"^rank (\d+) timed out in [^:]*: ")
_CLOSED = re.compile(r"rank (\d+)(?: \([^)]*\))? closed its connection")
_DEVIATING = re.compile(r"op mismatch on comm \d+: deviating ranks? ([\d, ]+)")
_NO_MAJORITY = re.compile(r"op mismatch on comm \d+ with no majority")
_CALLED = re.compile(r"ranks? ([\d, ]+) called")
_SAW = re.compile(r"rank (\d+) saw rank (\d+) run")
_SENT_WRONG = re.compile(r"rank (\d+)(?: \([^)]*\))? sent .* this rank runs")
_WAIT = re.compile(r"(receiving from|sending to|waiting on) rank (\d+)")
_OP_SEQ = re.compile(r"\b([a-z_]+) seq (\d+)")
_TRANSPORT = re.compile(r"(protocol error on the control link to|connection (?:reset|refused|to)|broken pipe"
                        r"|sent \d+ more bytes than)[^;]*?rank (\d+)|rank (\d+)[^;]*?(connection reset|broken pipe)",
                        re.I)


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


@dataclass
class Cause:
    """A failure reduced to its root: kind and the rank(s) the text blames."""

    kind: str  # peer_closed | mismatch | mismatch_no_majority | timeout | transport | other
    culprits: list[int] = field(default_factory=list)
    messengers: list[int] = field(default_factory=list)  # ranks that only forwarded the news
    root_text: str = ""
    reporter: Optional[int] = None  # the rank that originally failed, when the text says
    voted: bool = False  # culprits are the deviants of the ranks' own majority vote
    op: Optional[str] = None  # the failed op, when known from the records
    seq: Optional[int] = None


_KINDS = {"peer_closed", "transport", "mismatch", "timeout", "other"}


def cause_from_abort(a: AbortInfo, text: Optional[str], op: Optional[str] = None,
                     seq: Optional[int] = None) -> Cause:
    """The native abort notice as a dump writes it: no text is read."""
    kind = a.kind if a.kind in _KINDS else "other"
    messengers = [a.received_from] if a.received_from is not None else []
    culprits = [a.suspect] if a.suspect is not None and a.suspect != a.reporter else []
    voted = False
    if kind == "mismatch":  # only the vote names deviants; the suspect is one rank's view
        culprits, voted = list(a.deviating), bool(a.deviating)
    elif kind == "other" and messengers and a.reporter is not None:
        culprits = [a.reporter]  # a peer failed for its own reason and told us
    return Cause(kind, culprits, messengers, text or "", a.reporter, voted, op, seq)


def waited_on(text: Optional[str]) -> list[int]:
    """Ranks a watchdog or timeout message says it waited on ("waiting on rank 2 (...)")."""
    return sorted({int(w[1]) for w in _WAIT.findall(text or "")})


def op_and_seq(text: str) -> tuple[Optional[str], Optional[int]]:
    m = _OP_SEQ.search(text)
    return (m.group(1), int(m.group(2))) if m else (None, None)


def parse_cause(text: Optional[str]) -> Optional[Cause]:
    if not text:
        return None
    rest = _CONTEXT.sub("", text, count=1)
    messengers: list[int] = []
    reporter: Optional[int] = None
    while True:  # peel "aborted by rank X: " and "rank N failed: " prefixes down to the root
        m = _ABORTED.search(rest)
        if m and m.start() < 8:
            messengers.append(int(m.group(1)))
            rest = rest[m.end():]
            continue
        m = _RANK_FAILED.match(rest)
        if m:
            reporter = int(m.group(1))
            rest = rest[m.end():]
            continue
        break
    cause = Cause("other", [], messengers, rest, reporter)
    m = _DEVIATING.search(rest)
    if m:
        cause.kind, cause.culprits, cause.voted = "mismatch", _ints(m.group(1)), True
        return cause
    if _NO_MAJORITY.search(rest):
        cause.kind = "mismatch_no_majority"
        cause.culprits = sorted({r for g in _CALLED.findall(rest) for r in _ints(g)})
        return cause
    m = _SAW.search(rest)
    if m:
        cause.kind, cause.culprits, cause.reporter = "mismatch", [int(m.group(2))], int(m.group(1))
        return cause
    m = _SENT_WRONG.search(rest)
    if m:
        cause.kind, cause.culprits = "mismatch", [int(m.group(1))]
        return cause
    m = _CLOSED.search(rest)
    if m:
        cause.kind, cause.culprits = "peer_closed", [int(m.group(1))]
        return cause
    m = _RANK_TIMED_OUT.match(rest)
    if m or "timed out" in rest:
        if m:
            cause.reporter = int(m.group(1))
        cause.kind = "timeout"
        cause.culprits = sorted({int(w[1]) for w in _WAIT.findall(rest)})
        return cause
    m = _TRANSPORT.search(rest)
    if m:
        cause.kind = "transport"
        cause.culprits = [int(m.group(2) or m.group(3))]
        return cause
    if reporter is not None:
        cause.culprits = [reporter]
    return cause
