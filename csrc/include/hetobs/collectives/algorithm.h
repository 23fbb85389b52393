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
// Whether a chain's sends may be read by the receiver itself (shm single copy). With two ranks
// the two copies run in parallel (the sender's into the ring, the receiver's out of it), faster
// than the receiver's one (process_vm_readv copies at ~0.65 of memcpy); middle ranks copy
// twice, so from three ranks one copy wins (docs/algorithms.md).
inline bool chainPeerMayRead(int n) { return n > 2; }

}  // namespace hetobs
