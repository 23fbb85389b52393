#pragma once
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

}  // namespace hetobs
