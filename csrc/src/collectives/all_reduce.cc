// all_reduce, in place.
//  - direct (latency path, small payloads): everyone sends its buffer to everyone and
//    folds all n contributions in rank order, so every rank computes bit-identical
//    results with one round of messages.
//  - ring (bandwidth path): reduce-scatter then all-gather around the ring, n-1 steps
//    each; every step streams its block in frames, reducing as frames arrive. Over TCP
//    the steps are pipelined segment by segment (ring_pipeline.h).
//  - cma (bandwidth path, every rank on this host over shared memory): each rank reduces its
//    block straight from the peers' memory and writes it back into theirs (cma.cc).
#include <cstring>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/collectives/peer_items.h"
#include "hetobs/collectives/reduce_kernels.h"
#include "hetobs/collectives/ring_pipeline.h"

namespace hetobs {
namespace {

void direct(Communicator& c, const OpArgs& a) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = a.send_count * dtypeSize(a.dtype);
  uint8_t* in = c.scratch(bytes * size_t(n));  // slot p holds rank p's contribution
  exchangeWithEveryPeer(c, a.recv, bytes, in);
  // Fold in rank order into slot 0 (or straight into the output on rank 0).
  auto contribution = [&](int p) -> const uint8_t* { return p == r ? a.recv : in + size_t(p) * bytes; };
  uint8_t* acc = r == 0 ? a.recv : in;
  for (int p = 1; p < n; ++p) reduceInto(a.dtype, a.redop, acc, acc, contribution(p), a.send_count);
  if (a.redop == RedOp::kAvg) divideBy(a.dtype, acc, a.send_count, double(n));
  if (acc != a.recv) memcpy(a.recv, acc, bytes);
}

// One ring step: send block `s` to the right, receive block `t` from the left, reducing
// it into our copy (reduce-scatter) or copying it (all-gather).
void ringStep(Communicator& c, const OpArgs& a, Block s, Block t, bool reduce) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtypeSize(a.dtype);
  SendItem send{};
  send.peer = mod(r + 1, n);
  send.data = a.recv + s.offset * es;
  send.len = s.count * es;
  RecvItem recv{};
  recv.peer = mod(r - 1, n);
  recv.dst = a.recv + t.offset * es;
  recv.len = t.count * es;
  if (reduce) {
    recv.local = recv.dst;
    recv.mode = RecvMode::kReduce;
    recv.dtype = a.dtype;
    recv.redop = a.redop;
  }
  c.exchange(&send, 1, &recv, 1);
}

void ring(Communicator& c, const OpArgs& a) {
  const int n = c.size(), r = c.rank();
  // Reduce-scatter: after step k = n-2 this rank holds the full reduction of block r.
  for (int k = 0; k < n - 1; ++k)
    ringStep(c, a, blockOf(a.send_count, n, mod(r - k - 1, n)), blockOf(a.send_count, n, mod(r - k - 2, n)), true);
  if (a.redop == RedOp::kAvg) {
    Block mine = blockOf(a.send_count, n, r);
    divideBy(a.dtype, a.recv + mine.offset * dtypeSize(a.dtype), mine.count, double(n));
  }
  // All-gather the reduced blocks.
  for (int k = 0; k < n - 1; ++k)
    ringStep(c, a, blockOf(a.send_count, n, mod(r - k, n)), blockOf(a.send_count, n, mod(r - k - 1, n)), false);
}

}  // namespace

void allReduce(Communicator& c, const OpArgs& a) {
  if (c.size() == 1) return;  // avg over one rank is the identity
  const Algorithm algo = chooseAlgorithm(c, a);
  if (algo == Algorithm::kDirect) return direct(c, a);
  if (algo == Algorithm::kCma && allReduceCma(c, a)) return;
  if (ringPipelined(c)) return ringPipelinedAllReduce(c, a);  // TCP: steps overlap chunk by chunk
  ring(c, a);
}

}  // namespace hetobs
