#include "hetobs/collectives/algorithm.h"

#include <algorithm>

#include "hetobs/common/error.h"

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

Algorithm chooseAlgorithm(const Communicator& c, const OpArgs& a) {
  switch (a.op) {
    case OpKind::kAllReduce:
      return (a.send_count * dtypeSize(a.dtype) <= c.smallBytes() || a.send_count < size_t(c.size()))
                 ? Algorithm::kDirect
                 : Algorithm::kRing;
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      return Algorithm::kRing;
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
