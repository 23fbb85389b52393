"""Error causes -> root cause, so cascades are blamed on their origin, never on neighbours.

When one rank fails, its peers fail too: "rank 2 (host h, pid 7) closed its connection",
or "aborted by rank 1 (...): <root cause>" (the native core forwards the root cause
unchanged, so chains never grow). Each failure becomes a `Cause`: what kind of failure
it is at its root and which rank(s) it names as culprits. The messenger of an abort
notice is never a culprit.

Where each cause comes from, newest dumps first (docs/dump-schema.md):
- 2.1: `cause_info` on the dump and on each failed comm, {kind, culprits, reporter,
  messengers, op, seq, peer, gone}: `cause_from_fields` takes it as it is; no text is read.
- 1.1 and 2.0: the native abort notice `comms[].abort` (kind, reporter, suspect,
  received_from, the vote's deviants): `cause_from_abort`; the text is only quoted.
- 1.0, error dumps without `abort` (a wrapped library's comm) and foreign text: only the
  sentence. `parse_cause` reads it with the regexes below, which follow the native core's
  messages (csrc/src/comm/progress.cc, transport/*/channel.cc); unknown text becomes kind
  "other" with no culprit. `waited_on` reads a watchdog's "waiting on rank 1 (...), rank 2
  (...)" the same way for dumps older than 2.1 (2.1 carries `cause_info.culprits` and
  `in_flight.waiting_on`). These are the only regexes over the dumps' words in the diagnosis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from .summary import AbortInfo, CauseInfo

__all__ = ["Cause", "CauseKind", "parse_cause", "cause_from_abort", "cause_from_fields", "waited_on", "op_and_seq"]

# Text patterns: for dumps older than 2.1 and for text other writers produced (see above).
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
# "receiving from rank 1 (...)", "sending to rank 2 (...)", and a watchdog's list "waiting on
# rank 1 (host a, pid 7), rank 2 (host b, pid 8)": every rank of the list, up to the next ";".
_WAIT = re.compile(r"(?:receiving from|sending to) rank (\d+)")
_WAIT_LIST = re.compile(r"waiting on ((?:rank \d+(?: \([^)]*\))?(?:, )?)+)")
_LIST_RANK = re.compile(r"rank (\d+)")
_OP_SEQ = re.compile(r"\b([a-z_]+) seq (\d+)")
_TRANSPORT = re.compile(r"(protocol error on the control link to|connection (?:reset|refused|to)|broken pipe"
                        r"|sent \d+ more bytes than)[^;]*?rank (\d+)|rank (\d+)[^;]*?(connection reset|broken pipe)",
                        re.I)
# The native core's words for a peer whose listener refused every dial (reconnect.cc gonePeer).
GONE_CLAIM = "is gone: its listener at"


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


class CauseKind(str, Enum):
    """What a failure is at its root. The values are the dumps' own words (`abort.kind`,
    `cause_info.kind`), and what JSON output carries."""

    PEER_CLOSED = "peer_closed"  # a peer closed its connection (or its process is gone)
    TRANSPORT = "transport"  # a link broke: I/O or protocol error, could not be re-made
    MISMATCH = "mismatch"  # ranks called different ops at one seq
    MISMATCH_NO_MAJORITY = "mismatch_no_majority"  # ... and no op had a majority (text only)
    TIMEOUT = "timeout"  # the op's own timeout expired while it waited on peers
    HANG = "hang"  # the watchdog saw no progress (2.1 cause_info of a watchdog dump)
    OTHER = "other"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, text: str) -> "CauseKind":
        """The kind a dump names; one this reader does not know is OTHER."""
        try:
            return cls(text)
        except ValueError:
            return cls.OTHER


@dataclass
class Cause:
    """A failure reduced to its root: kind and the rank(s) it blames."""

    kind: CauseKind
    culprits: list[int] = field(default_factory=list)
    messengers: list[int] = field(default_factory=list)  # ranks that only forwarded the news
    root_text: str = ""
    reporter: Optional[int] = None  # the rank that originally failed, when known
    voted: bool = False  # culprits are the deviants of the ranks' own majority vote
    op: Optional[str] = None  # the failed op, when known
    seq: Optional[int] = None
    gone: Optional[bool] = None  # first-hand "the peer is gone" claim (None: only the text can tell)
    peer: Optional[int] = None  # the other end (link, awaited peer), when the fields say
    from_fields: bool = False  # from 2.1 `cause_info`: everything is known without the text

    def says_gone(self) -> bool:
        """A first-hand claim that the peer's process is gone (its listener refused every redial)."""
        return self.gone if self.gone is not None else GONE_CLAIM in self.root_text

    def text(self) -> str:
        """The sentence for people; rebuilt from the fields when the dump's text is empty."""
        if self.root_text:
            return self.root_text
        who = ", ".join(map(str, self.culprits)) or "no rank"
        where = f" in {self.op} seq {self.seq}" if self.op is not None else ""
        return f"{self.kind.value}{where} (culprit(s): {who}; reported by rank {self.reporter})"


def cause_from_fields(ci: CauseInfo, text: Optional[str], op: Optional[str] = None,
                      seq: Optional[int] = None) -> Cause:
    """A 2.1 dump's `cause_info` as written: the culprits are the writer's, no text is read.
    `op`/`seq` from the comm's failed record win over the fields' (the records' numbering)."""
    kind = CauseKind.of(ci.kind)
    return Cause(kind, list(ci.culprits), list(ci.messengers), text or "", ci.reporter,
                 kind is CauseKind.MISMATCH and bool(ci.culprits), op if op is not None else ci.op,
                 seq if op is not None else ci.seq, ci.gone, ci.peer, from_fields=True)


def cause_from_abort(a: AbortInfo, text: Optional[str], op: Optional[str] = None,
                     seq: Optional[int] = None) -> Cause:
    """The native abort notice as a 1.1/2.0 dump writes it: no text is read."""
    kind = CauseKind.of(a.kind)
    if kind in (CauseKind.HANG, CauseKind.MISMATCH_NO_MAJORITY):
        kind = CauseKind.OTHER  # not words an abort notice uses
    messengers = [a.received_from] if a.received_from is not None else []
    culprits = [a.suspect] if a.suspect is not None and a.suspect != a.reporter else []
    voted = False
    if kind is CauseKind.MISMATCH:  # only the vote names deviants; the suspect is one rank's view
        culprits, voted = list(a.deviating), bool(a.deviating)
    elif kind is CauseKind.OTHER and messengers and a.reporter is not None:
        culprits = [a.reporter]  # a peer failed for its own reason and told us
    return Cause(kind, culprits, messengers, text or "", a.reporter, voted, op, seq, peer=a.suspect)


def waited_on(text: Optional[str]) -> list[int]:
    """Ranks a watchdog or timeout message (dumps older than 2.1) says it waited on: every rank of
    "waiting on rank 1 (...), rank 2 (...)", and each "receiving from" / "sending to" rank."""
    text = text or ""
    found = {int(r) for r in _WAIT.findall(text)}
    for listed in _WAIT_LIST.findall(text):
        found.update(int(r) for r in _LIST_RANK.findall(listed))
    return sorted(found)


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
    cause = Cause(CauseKind.OTHER, [], messengers, rest, reporter)
    m = _DEVIATING.search(rest)
    if m:
        cause.kind, cause.culprits, cause.voted = CauseKind.MISMATCH, _ints(m.group(1)), True
        return cause
    if _NO_MAJORITY.search(rest):
        cause.kind = CauseKind.MISMATCH_NO_MAJORITY
        cause.culprits = sorted({r for g in _CALLED.findall(rest) for r in _ints(g)})
        return cause
    m = _SAW.search(rest)
    if m:
        cause.kind, cause.culprits, cause.reporter = CauseKind.MISMATCH, [int(m.group(2))], int(m.group(1))
        return cause
    m = _SENT_WRONG.search(rest)
    if m:
        cause.kind, cause.culprits = CauseKind.MISMATCH, [int(m.group(1))]
        return cause
    m = _CLOSED.search(rest)
    if m:
        cause.kind, cause.culprits = CauseKind.PEER_CLOSED, [int(m.group(1))]
        return cause
    m = _RANK_TIMED_OUT.match(rest)
    if m or "timed out" in rest:
        if m:
            cause.reporter = int(m.group(1))
        cause.kind = CauseKind.TIMEOUT
        cause.culprits = waited_on(rest)
        return cause
    m = _TRANSPORT.search(rest)
    if m:
        cause.kind = CauseKind.TRANSPORT
        cause.culprits = [int(m.group(2) or m.group(3))]
        return cause
    if reporter is not None:
        cause.culprits = [reporter]
    return cause
