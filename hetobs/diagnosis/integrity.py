"""`data_mismatch` verdicts: ranks whose result of a collective differs from the others'.

The native core compares result digests across ranks (HETOBS_DIGEST, csrc/include/hetobs/
collectives/digest.h) and, on a difference, every rank writes a dump of one incident whose
`cause_info` (kind `data_mismatch`) names the ranks whose result differs from the majority's
(none when there is no majority), the op, its seq, the communicator and the first differing
element. Every rank found the same thing, so the ranks' reports are merged, never trusted
one over another: a rank named by every reporter is named.
"""

from __future__ import annotations

from typing import Optional

from .confidence import confidence
from .job import LoadedJob
from .types import Verdict, VerdictKind

__all__ = ["data_mismatch_verdicts"]

KIND = "data_mismatch"


def data_mismatch_verdicts(job: LoadedJob) -> list[Verdict]:
    """One verdict per (comm, seq) that a rank's dump reports as a data mismatch."""
    found: dict[tuple[Optional[int], Optional[int]], list[tuple[int, object]]] = {}
    for r, d in sorted(job.dumps.items()):
        ci = d.cause_info
        if ci is not None and ci.kind == KIND:
            found.setdefault((ci.comm, ci.seq), []).append((r, ci))
    out = []
    for (comm, seq), reports in sorted(found.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] or 0)):
        infos = [ci for _, ci in reports]
        named = [set(ci.culprits) for ci in infos]  # type: ignore[attr-defined]
        agreed = sorted(set.intersection(*named)) if named else []
        majority = bool(agreed)
        element = next((ci.element for ci in infos if ci.element is not None), None)  # type: ignore[attr-defined]
        op = next((ci.op for ci in infos if ci.op), None)  # type: ignore[attr-defined]
        reporters = [r for r, _ in reports]
        where = f"first differing element {element}" if element is not None else "differing element not found"
        if majority:
            who = f"rank{'s' if len(agreed) > 1 else ''} {', '.join(map(str, agreed))}"
            summary = f"{who}: result of {op} seq {seq} on comm {comm} differs from the other ranks' ({where})"
        else:
            summary = (f"the ranks' results of {op} seq {seq} on comm {comm} differ with no majority: which copy is "
                       f"corrupt cannot be told ({where})")
        evidence = [f"{len(reporters)} rank(s) compared result digests and reported the difference "
                    f"(ranks {', '.join(map(str, reporters))})", where]
        out.append(Verdict(VerdictKind.DATA_MISMATCH, agreed, summary, evidence, comm=comm, seq=seq, op=op,
                           confidence=confidence(VerdictKind.DATA_MISMATCH, "majority" if majority else "no_majority")))
    return out
