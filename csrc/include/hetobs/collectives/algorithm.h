#pragma once
#include <vector>
// Collective algorithms, written against Communicator::exchange only (never a socket
// or a ring). One collective per file; this header is their shared vocabulary.
#include <cstddef>

#include "hetobs/comm/communicator.h"
#include "hetobs/record/op_record.h"

namespace hetobs {

// Block i of `count` elements split over n ranks, as numpy.array_split does.
struct Block {
  size_t offset;  // elements
  size_t count;
};
Block blockOf(size_t count, int n, int i);

inline int mod(int a, int n) { return ((a % n) + n) % n; }

// Payload size the records report (nccl-tests "size").
size_t opBytes(const OpArgs& a, int n);
Algorithm chooseAlgorithm(const Communicator& c, const OpArgs& a);

// Run `a` on `c` (dispatch to the files below).
void runCollective(Communicator& c, const OpArgs& a);
// The peers (comm ranks) the op's algorithm exchanges data with, into *out; returns true,
// leaving *out empty, when that is every peer (direct algorithms, all_to_all).
bool neededPeers(const Communicator& c, const OpArgs& a, std::vector<int>* out);

void allReduce(Communicator& c, const OpArgs& a);
// all_reduce, reduce_scatter and all_gather through the peers' memory (cma.cc); false, with
// nothing moved, when a rank may not read and write every peer's memory (every rank then runs
// the ring).
bool allReduceCma(Communicator& c, const OpArgs& a);
bool reduceScatterCma(Communicator& c, const OpArgs& a);
bool allGatherCma(Communicator& c, const OpArgs& a);
void reduceScatter(Communicator& c, const OpArgs& a);
void allGather(Communicator& c, const OpArgs& a);
void broadcast(Communicator& c, const OpArgs& a);
void reduce(Communicator& c, const OpArgs& a);
void allToAll(Communicator& c, const OpArgs& a);
void barrier(Communicator& c, const OpArgs& a);
void sendRecv(Communicator& c, const OpArgs& a);
void relay(Communicator& c, const OpArgs& a);

// Pipelining unit of the chain algorithms (broadcast, reduce).
constexpr size_t kSegmentBytes = 512 * 1024;
// Segments pipeline the chain through its middle ranks; two ranks have none, and there each
// segment would only add a round trip, so the message goes whole.
inline size_t chainSegmentBytes(int n, size_t bytes) { return n == 2 && bytes > kSegmentBytes ? bytes : kSegmentBytes; }
// Whether a chain's sends of an op of `bytes` may be read by the receiver itself (shm single
// copy). Middle ranks copy twice through the ring, so from three ranks one copy wins. With
// two ranks the ring's two copies run side by side (the sender's into frame k+1 while the
// receiver's out of frame k): one copy wins up to 1 MiB, the ring beyond, where the
// receiver's process_vm_readv of memory out of cache copies at ~0.65 of memcpy (2-rank
// broadcast busbw vs Open MPI: 256 KiB 0.69 -> 1.08 with one copy; 4 MiB 1.15 -> 0.83).
constexpr size_t kTwoRankChainSingleCopyMaxBytes = 1 << 20;
inline bool chainPeerMayRead(int n, size_t bytes) { return n > 2 || bytes <= kTwoRankChainSingleCopyMaxBytes; }

}  // namespace hetobs
