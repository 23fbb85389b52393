#pragma once
// Silent data corruption caught where it happens (HETOBS_DIGEST, docs/digests.md): after an
// all_reduce, all_gather or broadcast, whose result must be bit-identical on every rank, each
// rank hashes its result and the ranks compare the 8-byte digests in a tiny ring exchange on
// the op's own links (n-1 steps of one 8-byte frame: a shared-memory mail slot or one TCP
// frame). Sampled by sequence id (HETOBS_DIGEST_RATE), so every rank checks the same ops.
//
// On a difference the majority digest is the reference (never any one rank) and the ranks
// that differ from it are named; the first differing element is then found by the same ranks
// in a few more exchanges (64 piece digests per round, the differing piece split again, then
// the piece's values themselves). Every rank sees the same gathered data, so every rank
// reaches the same verdict without a coordinator.
//
// reduce_scatter's output differs per rank by design (each holds its own block): its
// "gathered part" is checked where the job gathers it (the all_gather after it, FSDP's
// pattern). A corrupted partial sum that a ring then copies to every rank is the same on all
// of them, and no comparison of results can see it; a rank's own fold, its copy of the
// result and the last hop into it are what this catches.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "hetobs/comm/communicator.h"

namespace hetobs {

// The digest of `n` bytes: four independent multiply-rotate lanes over 8-byte words (~10 GB/s
// here, memory-bound on large buffers). Each step is a bijection of its lane's state, so a
// change confined to one lane (any single flipped bit) always changes the digest.
uint64_t digestBytes(const uint8_t* p, size_t n);

// The result of `a` that must be identical on every rank, if the op has one.
bool resultOf(const OpArgs& a, uint8_t** data, size_t* count);

struct DigestVerdict {
  std::vector<int> differing;  // comm ranks whose result differs from the majority's (or every rank: no majority)
  bool majority = true;        // false: no digest held by more ranks than any other
  int64_t element = -1;        // the first element index where a rank differs (-1: not found)
};

// Every rank's `bytes` at `all + rank * bytes` (this rank's own included), by whatever carries
// the op: the native ring (below), or a wrapped vendor library's own all_gather
// (hetobs._torch_ext, through ExternalHooks::check_result). Throws on a failed exchange.
using GatherFn = std::function<void(const uint8_t* mine, size_t bytes, uint8_t* all)>;

// Compare this rank's `count` elements of `es` bytes at `data` with every rank's (n ranks),
// exchanging through `gather`; `scratch`: n * 8 bytes. Collective. Returns true on a
// difference, with *out filled on every rank alike.
bool compareResults(int n, const uint8_t* data, size_t count, size_t es, const GatherFn& gather, uint8_t* scratch,
                    DigestVerdict* out);

// Compare this rank's result of the op that just ran on `c` with every rank's. Collective
// over c's ring neighbours (frames carry the op's own description).
bool compareResults(Communicator& c, const OpArgs& a, DigestVerdict* out);

// HETOBS_TEST_FLIP_BIT: flip bit `bit` of element `element` (of `count`, `es` bytes each) at
// `data`; nothing past the end (test only).
void flipBit(uint8_t* data, size_t count, size_t es, uint64_t element, uint32_t bit);
// The same on the result of `a`.
void flipResultBit(const OpArgs& a, uint64_t element, uint32_t bit);

}  // namespace hetobs
