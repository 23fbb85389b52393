"""How a buffer is cut between the members of an island, and who relays what to whom.

Inside an island of n ranks a buffer of `count` elements is cut into n blocks of
ceil(count / n) elements (the last ones shorter or empty): the layout a vendor
reduce-scatter / all-gather of equal blocks produces once the buffer is padded to
n * ceil(count / n). Islands of different sizes cut the same buffer differently; the
common refinement of two cuts pairs every element range with exactly one owner on
each side. Relaying along those pairs makes every rank carry its own share, so all
links between two islands carry traffic, not only the leaders' (FlagCX's hybrid
runner, by contrast, funnels through the ranks that own NICs).

Where the island's library has no cheap all-gather (Gloo's costs about twice its
all-reduce), `routes(..., gather_after=False)` sends every block to every member of the
other island instead, so that island needs no gather afterwards: more bytes on the
relay, which is the faster path there, and fewer through the slow library.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["block_len", "block", "Segment", "pairs", "routes"]


def block_len(count: int, n: int) -> int:
    """Elements per block when `count` elements are cut into `n` equal (padded) blocks."""
    return -(-count // n) if count else 0


def block(count: int, n: int, i: int) -> tuple[int, int]:
    """[start, end) of block `i` of `count` elements cut into `n` blocks."""
    length = block_len(count, n)
    return min(i * length, count), min((i + 1) * length, count)


@dataclass(frozen=True)
class Segment:
    src: int    # index of the sending member in its island
    dst: int    # index of the receiving member in its island
    start: int  # element range [start, end) of the buffer
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def pairs(count: int, n_src: int, n_dst: int) -> list[Segment]:
    """The common refinement of a cut into `n_src` blocks and a cut into `n_dst` blocks:
    each non-empty segment with the member that holds it on each side, in buffer order."""
    out: list[Segment] = []
    i = j = 0
    pos = 0
    while pos < count:
        a0, a1 = block(count, n_src, i)
        b0, b1 = block(count, n_dst, j)
        if a1 <= pos:
            i += 1
            continue
        if b1 <= pos:
            j += 1
            continue
        end = min(a1, b1)
        out.append(Segment(i, j, pos, end))
        pos = end
    return out


def routes(count: int, n_src: int, n_dst: int, gather_after: bool) -> list[Segment]:
    """Who sends which part of a buffer, cut among the `n_src` members of one island, to the
    `n_dst` members of another. gather_after: each receiver gets only its own block (its
    island all-gathers afterwards); else every receiver gets the whole buffer."""
    if gather_after:
        return pairs(count, n_src, n_dst)
    out = []
    for j in range(n_dst):
        for i in range(n_src):
            start, end = block(count, n_src, i)
            if end > start:
                out.append(Segment(i, j, start, end))
    return out
