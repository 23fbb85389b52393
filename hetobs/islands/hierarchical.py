"""Hierarchical collectives: the vendor library inside each island, the relay between.

Every function takes flat, contiguous tensors (the backend flattens), runs on every
rank of the group, and leaves results equal to the flat collective's. Each island cuts
a buffer into equal padded blocks (partition.py); the relay pairs blocks across islands
so every rank carries its own share. Partial results are folded in island order on
every rank that folds them, so all ranks hold bit-identical results.

all_reduce  = reduce-scatter in each island -> exchange of partial blocks with the
              counterpart ranks of every other island, folded in island order -> all-gather
              in each island. Host tensors on islands of equal size take the counterpart
              communicator instead of the exchange: one native all-reduce among the ranks that
              hold the same block in every island, which folds each chunk as it arrives
              (no receive buffer, no second pass over memory).
broadcast   = broadcast in the root's island -> the root island's blocks to their
              counterparts -> all-gather in every other island.
reduce_scatter = in each island, a reduce-scatter of its members' blocks and a reduction
              of every other island's members' blocks -> each island's partial of a block,
              from the ranks that hold it, to the rank whose block it is, folded in island
              order (no all-gather; each partial crosses the relay once, to one island).
all_gather  = all-gather in each island -> each island's gathered buffer, block-wise, to
              its counterparts -> one all-gather per island of what arrived.
all_to_all  = the vendor all-to-all for blocks within the island, the relay for the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..comm import Communicator
from ..torch._common import reduction
from .partition import block, block_len, pairs, routes
from .relay import PhaseClock, Relay
from .topology import Island, Topology
from .vendor import IslandGroup, cheap_scatter

__all__ = ["Hierarchy", "all_reduce", "reduce_scatter", "broadcast", "all_gather", "all_to_all", "barrier", "send",
           "recv"]

_FOLD = {
    dist.ReduceOp.SUM: torch.add, dist.ReduceOp.AVG: torch.add, dist.ReduceOp.PRODUCT: torch.mul,
    dist.ReduceOp.MIN: torch.minimum, dist.ReduceOp.MAX: torch.maximum,
}


@dataclass
class Hierarchy:
    topo: Topology
    rank: int            # rank in the group
    inner: IslandGroup   # this rank's island
    relay: Relay
    # The ranks with this rank's island rank in every island, ordered by island (native);
    # None unless all islands have one size.
    counterparts: Communicator | None = None
    _scratch: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict)

    def scratch(self, like: torch.Tensor, slot: int) -> torch.Tensor:
        """A receive buffer shaped like `like`, kept between ops: a fresh one per op would
        page-fault its whole size every time (glibc maps large blocks anew on each malloc),
        which measured as much time as the relay itself at 64 MiB (docs/islands.md)."""
        key = (like.dtype, like.device, slot)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < like.numel():
            buf = self._scratch[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
        return buf[:like.numel()]

    @property
    def island(self) -> Island:
        return self.topo.of(self.rank)

    @property
    def irank(self) -> int:
        return self.island.rank_of(self.rank)

    def others(self) -> list[Island]:
        return [i for i in self.topo.islands if i.index != self.island.index]


def fold_op(op: Any) -> Any:
    """The elementwise torch function that folds two partials for reduce op `op`."""
    for k, f in _FOLD.items():
        if op == k:
            return f
    raise ValueError(f"reduce op {op} is not supported by hetobs_islands (sum, product, min, max, avg are)")


def _identity(op: Any, dtype: torch.dtype) -> float | int | bool:
    """What padding must hold so it never changes a reduction."""
    if op == dist.ReduceOp.PRODUCT:
        return 1
    if op == dist.ReduceOp.MIN or op == dist.ReduceOp.MAX:
        big = op == dist.ReduceOp.MIN
        if dtype.is_floating_point:
            return float("inf") if big else float("-inf")
        if dtype == torch.bool:
            return big
        info = torch.iinfo(dtype)
        return info.max if big else info.min
    return 0


def _inner_op(op: Any) -> Any:
    # An average over uneven islands is the global sum over the world size: sum inside.
    return dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op


def _padded(flat: torch.Tensor, total: int, fill: float | int | bool) -> torch.Tensor:
    if flat.numel() == total:
        return flat
    p = torch.empty(total, dtype=flat.dtype, device=flat.device)
    p[:flat.numel()].copy_(flat)
    p[flat.numel():].fill_(fill)
    return p


def all_reduce(h: Hierarchy, clock: PhaseClock, flat: torch.Tensor, op: Any) -> None:
    fold_op(op)  # an unsupported op fails before anything moves
    if op == dist.ReduceOp.AVG and not flat.dtype.is_floating_point:
        raise ValueError(f"reduce op AVG needs a floating dtype, got {flat.dtype}")
    if flat.numel() == 0:
        return
    if len(h.topo.islands) == 1:
        clock.vendor(h.inner.all_reduce, flat, op)
        return
    part = _island_partial(h, clock, flat, op)
    if h.counterparts is not None and _by_counterparts(h, flat):
        # Each counterpart communicator runs the same algorithm over the same count in island
        # order, so every rank still ends bit-identical; the fold happens as chunks arrive.
        clock.wire(h.counterparts.all_reduce, part.mine, reduction(_inner_op(op)))
    else:
        _exchange_and_fold(h, clock, part, op)
    if op == dist.ReduceOp.AVG:
        part.mine.div_(h.topo.size)
    if part.shard is not None:
        clock.vendor(h.inner.all_gather, part.padded, part.shard)
        if part.padded is not flat:
            flat.copy_(part.padded[:part.count])


@dataclass
class _Partial:
    """This island's partial of what this rank carries between islands: its own block
    (`shard` of the padded buffer, gathered afterwards) or the whole buffer (shard None)."""
    mine: torch.Tensor
    start: int  # where `mine` starts in the buffer
    count: int  # elements in the buffer
    padded: torch.Tensor
    shard: torch.Tensor | None


def _island_partial(h: Hierarchy, clock: PhaseClock, flat: torch.Tensor, op: Any) -> _Partial:
    count, n = flat.numel(), h.island.size
    if _gathers(h.island):
        length = block_len(count, n)
        padded = _padded(flat, n * length, _identity(op, flat.dtype))
        shard = torch.empty(length, dtype=flat.dtype, device=flat.device)
        clock.vendor(h.inner.reduce_scatter, shard, padded, _inner_op(op))
        start, end = block(count, n, h.irank)
        return _Partial(shard[:end - start], start, count, padded, shard)
    # The island's partial of everything; the other islands send theirs whole.
    if n > 1:
        clock.vendor(h.inner.all_reduce, flat, _inner_op(op))
    return _Partial(flat, 0, count, flat, None)


def _exchange_and_fold(h: Hierarchy, clock: PhaseClock, part: _Partial, op: Any) -> None:
    """The relay: partials to and from the counterparts of every other island, folded in
    island order."""
    fold = fold_op(op)
    isl, me, mine, start, count = h.island, h.irank, part.mine, part.start, part.count
    n, scatter = isl.size, part.shard is not None
    partial: dict[int, torch.Tensor] = {isl.index: mine}
    sends, recvs = [], []
    for slot, other in enumerate(h.others()):
        theirs = h.scratch(mine, slot)
        partial[other.index] = theirs
        # A route's shape is the receiver's choice: its own block, or the whole buffer.
        # Either way this rank sends from its block of its island's cut (`mine` starts at `start`).
        sends += [(other.members[seg.dst], mine[seg.start - start:seg.end - start])
                  for seg in routes(count, n, other.size, _gathers(other)) if seg.src == me]
        recvs += [(other.members[seg.src], theirs[seg.start - start:seg.end - start])
                  for seg in routes(count, other.size, n, scatter) if seg.dst == me]
    h.relay.run(sends, recvs, clock)
    order = [partial[i.index] for i in h.topo.islands]
    if len(order) == 2:  # `mine` is one of the two: fold in place
        fold(order[0], order[1], out=mine)
    else:
        acc = fold(order[0], order[1])
        for p in order[2:]:
            fold(acc, p, out=acc)
        mine.copy_(acc)


def reduce_scatter(h: Hierarchy, clock: PhaseClock, out: torch.Tensor, inp: torch.Tensor, op: Any) -> None:
    """out = block `h.rank` (out.numel() elements) of the reduction of every rank's inp.

    Moves only what is needed: island I's partial of the blocks of island J's members goes
    to J and nowhere else (a reduce of everything, then keeping one block, carried every
    island's partial of every block over the relay: twice as much at two equal islands).
    Each island reduces the blocks of its own members (reduce-scatter: each rank keeps its
    own) and those of all other islands' members, laid out island by island
    (`_foreign_layout`): two reduce-scatters where the library has a cheap one, else one
    all-reduce of both. Each rank's cut of the foreign layout goes to the ranks whose
    blocks it holds. Every rank folds the islands' partials of its block in
    island order, as all_reduce does.
    """
    fold = fold_op(op)  # an unsupported op fails before anything moves
    if op == dist.ReduceOp.AVG and not out.dtype.is_floating_point:
        raise ValueError(f"reduce op AVG needs a floating dtype, got {out.dtype}")
    c = out.numel()
    if c == 0:
        return
    isl, me, inner = h.island, h.irank, _inner_op(op)
    if len(h.topo.islands) == 1:  # island ranks are group ranks (members ascending)
        out.copy_(_own_blocks(h, clock, inp, c, inner))
        if op == dist.ReduceOp.AVG:
            out.div_(h.topo.size)
        return
    # This island's partial of every other island's blocks: a cut of it per rank here.
    layout, total = _foreign_layout(h.topo, isl, c)
    lo, hi = block(total, isl.size, me)
    if _gathers(isl):
        own = _own_blocks(h, clock, inp, c, inner)
        foreign = torch.cat([inp[r * c:(r + 1) * c] for other in h.others() for r in other.members])
        length = block_len(total, isl.size)
        padded = _padded(foreign, isl.size * length, _identity(op, out.dtype))
        held = torch.empty(length, dtype=out.dtype, device=out.device)
        clock.vendor(h.inner.reduce_scatter, held, padded, inner)
        held_at = lo  # `held` starts at element lo of the layout
    else:
        # No cheap reduce-scatter here: one all-reduce of everything, own blocks first
        # (one vendor op, not two: at 1 MiB the second cost as much as the relay saved).
        both = torch.cat([inp[r * c:(r + 1) * c] for r in isl.members]
                         + [inp[r * c:(r + 1) * c] for other in h.others() for r in other.members])
        if isl.size > 1:
            clock.vendor(h.inner.all_reduce, both, inner)
        own = both[me * c:(me + 1) * c]
        held, held_at = both, -isl.size * c  # the layout starts after the own blocks
    partial = {isl.index: own}
    sends, recvs = [], []
    for other in h.others():
        at = layout[other.index]  # where `other`'s blocks start in this island's layout
        for j, r in enumerate(other.members):
            s, e = max(lo, at + j * c), min(hi, at + (j + 1) * c)
            if e > s:
                sends.append((r, held[s - held_at:e - held_at]))
        # What `other` holds of this rank's block: its own layout, its own cut.
        theirs = h.scratch(out, other.index)
        partial[other.index] = theirs
        their_layout, their_total = _foreign_layout(h.topo, other, c)
        start = their_layout[isl.index] + me * c
        for i, q in enumerate(other.members):
            a, b = block(their_total, other.size, i)
            s, e = max(a, start), min(b, start + c)
            if e > s:
                recvs.append((q, theirs[s - start:e - start]))
    h.relay.run(sends, recvs, clock)
    order = [partial[i.index] for i in h.topo.islands]
    acc = fold(order[0], order[1], out=out.view(-1))
    for p in order[2:]:
        fold(acc, p, out=acc)
    if op == dist.ReduceOp.AVG:
        out.div_(h.topo.size)


def _own_blocks(h: Hierarchy, clock: PhaseClock, inp: torch.Tensor, c: int, inner: Any) -> torch.Tensor:
    """This island's partial of this rank's own block (the island's members' blocks, reduce-scattered)."""
    isl = h.island
    mine = torch.cat([inp[r * c:(r + 1) * c] for r in isl.members]) if isl.size > 1 else \
        inp[h.rank * c:(h.rank + 1) * c]
    if isl.size == 1:
        return mine
    if _gathers(isl):
        shard = torch.empty(c, dtype=inp.dtype, device=inp.device)
        clock.vendor(h.inner.reduce_scatter, shard, mine, inner)
        return shard
    clock.vendor(h.inner.all_reduce, mine, inner)
    return mine[h.irank * c:(h.irank + 1) * c]


def _foreign_layout(topo: Topology, isl: Island, c: int) -> tuple[dict[int, int], int]:
    """Where each other island's members' blocks start in `isl`'s buffer of foreign blocks
    (islands in order, members ascending), and that buffer's length. Sender and receiver
    both compute it from the topology, so both cut alike."""
    at, pos = {}, 0
    for other in topo.islands:
        if other.index != isl.index:
            at[other.index] = pos
            pos += other.size * c
    return at, pos


def _by_counterparts(h: Hierarchy, flat: torch.Tensor) -> bool:
    # Decided from what every rank knows alike (the topology, the job-wide relay settings and
    # the op's dtype), never from this rank's tensors: both ends must take the same path.
    # Device islands need the relay's staging; HETOBS_RELAY_STAGE=host asks for it on host
    # tensors too (how the pipeline is measured without a device). Counterparts hold the same
    # element range only where every island cuts alike.
    return (h.counterparts is not None and all(i.device == "cpu" for i in h.topo.islands)
            and not h.relay.staged_host and flat.dtype in _NATIVE_DTYPES
            and len({_gathers(i) for i in h.topo.islands}) == 1)


_NATIVE_DTYPES = {torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                  torch.float32, torch.float64}


def broadcast(h: Hierarchy, clock: PhaseClock, flat: torch.Tensor, root: int) -> None:
    isl, me = h.island, h.irank
    home = h.topo.of(root)
    if flat.numel() == 0:
        return
    if len(h.topo.islands) == 1:
        clock.vendor(h.inner.broadcast, flat, home.rank_of(root))
        return
    count = flat.numel()
    if isl.index == home.index:
        if isl.size > 1:
            clock.vendor(h.inner.broadcast, flat, home.rank_of(root))
        sends = [(other.members[seg.dst], flat[seg.start:seg.end]) for other in h.others()
                 for seg in routes(count, home.size, other.size, _gathers(other)) if seg.src == me]
        h.relay.run(sends, [], clock)
        return
    n = isl.size
    if not _gathers(isl):  # the whole buffer comes over the relay
        recvs = [(home.members[seg.src], flat[seg.start:seg.end])
                 for seg in routes(count, home.size, n, False) if seg.dst == me]
        h.relay.run([], recvs, clock)
        return
    length = block_len(count, n)
    padded = _padded(flat, n * length, 0)
    start, end = block(count, n, me)
    shard = padded[me * length:me * length + length]
    recvs = [(home.members[seg.src], shard[seg.start - start:seg.end - start])
             for seg in pairs(count, home.size, n) if seg.dst == me]
    h.relay.run([], recvs, clock)
    own = shard.clone()  # all-gather's input must not alias its output
    clock.vendor(h.inner.all_gather, padded, own)
    if padded is not flat:
        flat.copy_(padded[:count])


def _gathers(isl: Island) -> bool:
    """Whether `isl` gathers blocks itself after a relay (else it receives whole buffers).
    Every rank decides this alike from the topology: both ends of a route must agree."""
    return isl.size > 1 and cheap_scatter(isl.backend)


def all_gather(h: Hierarchy, clock: PhaseClock, out: torch.Tensor, inp: torch.Tensor) -> None:
    """out[r*c:(r+1)*c] = rank r's inp, for every group rank r (islands need not be contiguous)."""
    isl, me, c = h.island, h.irank, inp.numel()
    n = isl.size
    if c == 0:
        return
    if len(h.topo.islands) == 1:
        clock.vendor(h.inner.all_gather, out, inp)
        return
    gathered = torch.empty(n * c, dtype=inp.dtype, device=inp.device)
    if n > 1:
        clock.vendor(h.inner.all_gather, gathered, inp)
    else:
        gathered.copy_(inp)
    _place(out, gathered, isl, c)
    sends, recvs, arrived = [], [], []
    for other in h.others():
        # Into an island that gathers: its members' blocks of our gathered buffer. Into
        # one that does not: each of our ranks' input to each of its ranks.
        sends += ([(other.members[seg.dst], gathered[seg.start:seg.end])
                   for seg in pairs(n * c, n, other.size) if seg.src == me] if _gathers(other) else
                  [(q, inp) for q in other.members])
        if _gathers(isl):
            total = other.size * c
            start, end = block(total, n, me)
            mine = torch.empty(block_len(total, n), dtype=inp.dtype, device=inp.device)
            arrived.append((other, mine))
            recvs += [(other.members[seg.src], mine[seg.start - start:seg.end - start])
                      for seg in pairs(total, other.size, n) if seg.dst == me]
        else:
            recvs += [(q, out[q * c:(q + 1) * c]) for q in other.members]
    h.relay.run(sends, recvs, clock)
    if not arrived:
        return
    # One all-gather in the island rebuilds every other island's buffer from its blocks.
    packed = torch.cat([m for _, m in arrived]) if len(arrived) > 1 else arrived[0][1]
    everyone = torch.empty(n * packed.numel(), dtype=inp.dtype, device=inp.device)
    clock.vendor(h.inner.all_gather, everyone, packed)
    rows = everyone.view(n, packed.numel())
    offset = 0
    for other, m in arrived:
        width = m.numel()
        _place(out, rows[:, offset:offset + width].reshape(-1)[:other.size * c], other, c)
        offset += width


def _place(out: torch.Tensor, gathered: torch.Tensor, isl: Island, c: int) -> None:
    for i, r in enumerate(isl.members):
        out[r * c:(r + 1) * c].copy_(gathered[i * c:(i + 1) * c])


def all_to_all(h: Hierarchy, clock: PhaseClock, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
               in_splits: list[int]) -> None:
    """Element-unit splits per group rank; block p of inp goes to rank p, block p of out comes from it."""
    isl = h.island
    ioff = [sum(in_splits[:p]) for p in range(len(in_splits))]
    ooff = [sum(out_splits[:p]) for p in range(len(out_splits))]
    if len(h.topo.islands) == 1:
        clock.vendor(h.inner.all_to_all, out, inp, out_splits, in_splits)
        return
    foreign = [p for p in range(h.topo.size) if h.topo.island_of[p] != isl.index]
    h.relay.run([(p, inp[ioff[p]:ioff[p] + in_splits[p]]) for p in foreign],
                [(p, out[ooff[p]:ooff[p] + out_splits[p]]) for p in foreign], clock)
    local_in = torch.cat([inp[ioff[p]:ioff[p] + in_splits[p]] for p in isl.members])
    local_out = torch.empty(sum(out_splits[p] for p in isl.members), dtype=out.dtype, device=out.device)
    if isl.size > 1:
        clock.vendor(h.inner.all_to_all, local_out, local_in, [out_splits[p] for p in isl.members],
                                              [in_splits[p] for p in isl.members])
    else:
        local_out.copy_(local_in)
    offset = 0
    for p in isl.members:
        out[ooff[p]:ooff[p] + out_splits[p]].copy_(local_out[offset:offset + out_splits[p]])
        offset += out_splits[p]


def barrier(h: Hierarchy, clock: PhaseClock) -> None:
    all_reduce(h, clock, torch.zeros(1, dtype=torch.int32, device=h.island.device), dist.ReduceOp.SUM)


def send(h: Hierarchy, clock: PhaseClock, flat: torch.Tensor, peer: int) -> None:
    if h.topo.island_of[peer] == h.island.index:
        clock.vendor(h.inner.send, flat, h.island.rank_of(peer))
    else:
        h.relay.run([(peer, flat)], [], clock)


def recv(h: Hierarchy, clock: PhaseClock, flat: torch.Tensor, peer: int) -> None:
    if h.topo.island_of[peer] == h.island.index:
        clock.vendor(h.inner.recv, flat, h.island.rank_of(peer))
    else:
        h.relay.run([], [(peer, flat)], clock)
