"""How sure each finding is: one table, by verdict kind and the evidence that found it.

Every verdict's `confidence` comes from here, so the kinds can be compared side by side and
tuned in one place. The numbers are ordinal more than probabilities: 0.9 and above, the
evidence shows the fault directly (a process gone at the incident, a cycle of waits, data
that stopped on a link); 0.7-0.85, it points at one culprit without proving it; 0.5 and
below, the culprit is a guess that explains the incident when nothing else does.
`MIN_EXCLUDE_CONFIDENCE` (engine.py) separates the findings that put a host on the exclude
list from the guesses.
"""

from __future__ import annotations

from .types import VerdictKind

__all__ = ["CONFIDENCE", "confidence", "majority_confidence"]

K = VerdictKind

CONFIDENCE: dict[VerdictKind, dict[str, float]] = {
    K.RANK_DEAD: {
        "gone_at_incident": 0.95,  # its process is gone and peers saw it gone (unanswered, closed) then
        "exited_with_error_before": 0.9,  # its exit status was recorded before the incident
        "closed_connections": 0.8,  # on another host: its peers saw its connections close mid-op
        "gone_not_answered": 0.75,  # its process is gone and nobody heard from it at the incident
        "exited_with_error": 0.5,  # exited with an error at an unknown time, nothing else explains it
        "gone_after_answering": 0.4,  # answered at the incident, gone now: only nothing else explains it
    },
    K.RANK_UNRESPONSIVE: {
        "stopped": 0.95,  # state T and nobody heard from it
        "silent_while_waited_on": 0.8,  # lived on past the incident, answered nobody, peers waited on it
        "silent": 0.7,  # exists (or lived on) but answered nobody
        "stopped_after_answering": 0.5,  # stopped now, but it answered at the incident
        "nothing_else": 0.4,  # no dump and nothing else explains the incident
    },
    K.RANK_NOT_JOINED: {
        "native_records": 0.9,  # hetobs records: its peers wait in the op, it has not called it
        "foreign_records": 0.8,  # Flight Recorder records: no wait times
        "p2p_peer": 0.8,  # a point-to-point op waits on it and it has no matching op in flight
        "exited_while_needed": 0.6,  # exited cleanly while its peers still needed it
        "waited_on_until_timeout": 0.6,  # only its peers' timeouts name it
        "few_joined": 0.5,  # fewer ranks joined than did not: maybe the joiners issued a stray op
    },
    K.OP_MISMATCH: {
        "majority_floor": 0.5,  # the records' majority vote: 0.5 + share / 2 ...
        "majority_cap": 0.95,  # ... at most this
        "vote_over_weak_records": 0.8,  # the ranks' own vote names the deviants the records could not
        "vote_only": 0.7,  # the ranks' own vote, no records of the op
        "no_majority": 0.3,  # every side named: which deviated cannot be told
    },
    K.LINK_STALLED: {
        "sent_not_received": 0.9,  # both ends in the op: the sender sent frames the receiver never got
        "sender_moved_on": 0.85,  # the sender finished the op; frames it sent never reached the receiver
        "host_path": 0.75,  # a whole host silent while TCP toward it loses packets
        "relay_wire": 0.85,  # an island relay's chunks stopped on the wire between two ranks
    },
    K.RANK_STALLED: {
        "one_candidate": 0.8,  # the walk leaves one rank that could have stopped the data
        "several_candidates": 0.5,  # ... or several
    },
    K.DEADLOCK: {
        "cycle": 0.9,  # a cycle of waits across communicators
    },
    K.TRANSPORT_ERROR: {
        "link_broke_both_alive": 0.75,  # a link could not be re-made while both ends were alive
    },
    K.STRAGGLER: {
        "arrives_late": 0.7,  # arrives last at collectives consistently
    },
    K.SLOW_LINK: {
        "bandwidth_outlier": 0.6,  # far below the other links of its transport
        "tcp_outlier": 0.6,  # a live window: far less delivered (or far longer rtt) than the best link
    },
    K.DATA_MISMATCH: {
        "majority": 0.95,  # the rank's result digest differs from the one most ranks hold
        "no_majority": 0.4,  # the results differ, no digest has a majority: every rank named, none blamed
    },
}


def confidence(kind: VerdictKind, basis: str) -> float:
    """The confidence of a `kind` verdict found on `basis` (a key of CONFIDENCE[kind])."""
    return CONFIDENCE[kind][basis]


def majority_confidence(share: float) -> float:
    """An op mismatch decided by the records' majority, which `share` of the ranks make up."""
    t = CONFIDENCE[K.OP_MISMATCH]
    return min(t["majority_cap"], t["majority_floor"] + share / 2)
