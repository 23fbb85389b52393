#include "hetobs/collectives/algorithm.h"

#include <algorithm>

#include "hetobs/common/error.h"
#include "hetobs/relay/relay.h"

namespace hetobs {

Block blockOf(size_t count, int n, int i) {
  size_t base = count / size_t(n), extra = count % size_t(n);
  size_t ui = size_t(i);
  return Block{ui * base + (ui < extra ? ui : extra), base + (ui < extra ? 1 : 0)};
}

size_t opBytes(const OpArgs& a, int n) {
  size_t es = dtypeSize(a.dtype);
  switch (a.op) {
    case OpKind::kAllGather:
      return a.recv_count * es;  // nccl-tests reports the gathered size
    case OpKind::kReduceScatter:
      return a.send_count * es;
    case OpKind::kBarrier:
      return 0;
    case OpKind::kRecv:
      return a.recv_count * es;
    case OpKind::kRelay:
      return std::max(a.send_count, a.recv_count);  // bytes per direction (the larger one)
    default:
      (void)n;
      return a.send_count * es;
  }
}

namespace {

// Whether a payload of `bytes` takes the one-round direct path: up to HETOBS_SMALL_BYTES (0
// forces the ring, 2^62 direct), divided by n-1 on one host over shared memory. There
// all_reduce's direct is bound by the (n-1) S bytes each rank copies in and folds, and
// all_gather's and reduce_scatter's, with the ring's bytes, by n-1 messages at once instead
// of one per step: measured even with the ring or behind from 32-64 KiB at 3-4 ranks
// (docs/algorithms.md). Over TCP each of the ring's dependent steps costs a wake-up in poll(),
// which keeps direct ahead up to the plain threshold.
size_t directLimit(const Communicator& c) {
  size_t small = c.smallBytes();
  if (c.oneHostShm() && c.size() > 2) small /= size_t(c.size() - 1);
  return small;
}
bool directFits(const Communicator& c, size_t bytes) { return bytes <= directLimit(c); }

// all_gather and reduce_scatter take direct only up to this many ranks: it connects every
// pair, and a larger world would for one small all_gather (split() runs one) where the ring
// connects only neighbours (links open on demand). Measured up to 4.
constexpr int kDirectMaxRanks = 8;

// all_reduce above direct's sizes goes through the peers' memory when every member is on this
// host over shared memory (cma.cc), up to kDirectMaxRanks (it connects every pair),
// unless HETOBS_SMALL_BYTES=0 forces the ring or an op found a link that may not (every rank
// learnt that in the op, so all choose alike after it).
// Where cma runs, all_reduce's direct keeps payloads up to this share of HETOBS_SMALL_BYTES (16 KiB
// at the default): cma passed direct between 8 and 16 KiB at 2, 3 and 4 ranks (docs/algorithms.md).
constexpr size_t kCmaDirectShare = 4;
bool cmaFits(const Communicator& c) {
  return c.oneHostShm() && c.size() <= kDirectMaxRanks && c.smallBytes() > 0 && !c.peerMemoryRefused();
}

// reduce_scatter and all_gather go through the peers' memory where all_reduce's cma would run,
// from 3 ranks (at 2 the ring's one step already reads, or for all_gather writes, the peer's
// buffer in one copy) and above HETOBS_SMALL_BYTES: between direct's sizes and that, the ring
// led cma by up to 1.5x (32 KiB) or tied it, cma led from 128-256 KiB (3 and 4 ranks,
// docs/algorithms.md).
bool othersCmaFits(const Communicator& c, size_t bytes) {
  return c.size() > 2 && cmaFits(c) && bytes > c.smallBytes();
}

}  // namespace

Algorithm chooseAlgorithm(const Communicator& c, const OpArgs& a) {
  const size_t es = dtypeSize(a.dtype);
  switch (a.op) {
    case OpKind::kAllReduce: {
      const size_t bytes = a.send_count * es;
      if (a.send_count < size_t(c.size())) return Algorithm::kDirect;
      if (cmaFits(c)) return bytes <= std::min(directLimit(c), c.smallBytes() / kCmaDirectShare) ? Algorithm::kDirect
                                                                                              : Algorithm::kCma;
      return directFits(c, bytes) ? Algorithm::kDirect : Algorithm::kRing;
    }
    case OpKind::kReduceScatter:  // S: the input
      if (c.size() <= kDirectMaxRanks && directFits(c, a.send_count * es)) return Algorithm::kDirect;
      return othersCmaFits(c, a.send_count * es) ? Algorithm::kCma : Algorithm::kRing;
    case OpKind::kAllGather:  // S: the gathered output
      if (c.size() <= kDirectMaxRanks && directFits(c, a.recv_count * es)) return Algorithm::kDirect;
      return othersCmaFits(c, a.recv_count * es) ? Algorithm::kCma : Algorithm::kRing;
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      return Algorithm::kChain;
    case OpKind::kAllToAll:
    case OpKind::kBarrier:
      return Algorithm::kDirect;
    default:
      return Algorithm::kP2P;
  }
}

bool neededPeers(const Communicator& c, const OpArgs& a, std::vector<int>* out) {
  out->clear();
  const int n = c.size(), r = c.rank();
  if (n == 1) return false;
  switch (a.op) {
    case OpKind::kSend:
    case OpKind::kRecv:
      out->push_back(a.root_or_peer);
      return false;
    case OpKind::kRelay:
      for (const auto* list : {&a.relay->sends, &a.relay->recvs})
        for (const RelayMessage& m : *list) out->push_back(m.peer);
      return false;
    default:
      break;
  }
  switch (chooseAlgorithm(c, a)) {
    case Algorithm::kRing:
    case Algorithm::kChain:  // the chain runs along the ring from the root
      out->push_back((r + 1) % n);
      out->push_back((r + n - 1) % n);
      return false;
    default:
      return true;
  }
}

void runCollective(Communicator& c, const OpArgs& a) {
  switch (a.op) {
    case OpKind::kAllReduce:
      return allReduce(c, a);
    case OpKind::kReduceScatter:
      return reduceScatter(c, a);
    case OpKind::kAllGather:
      return allGather(c, a);
    case OpKind::kBroadcast:
      return broadcast(c, a);
    case OpKind::kReduce:
      return reduce(c, a);
    case OpKind::kAllToAll:
      return allToAll(c, a);
    case OpKind::kBarrier:
      return barrier(c, a);
    case OpKind::kSend:
    case OpKind::kRecv:
      return sendRecv(c, a);
    case OpKind::kRelay:
      return relay(c, a);
    default:
      throw Error(strFormat("unknown op code %d", int(a.op)));
  }
}

}  // namespace hetobs
