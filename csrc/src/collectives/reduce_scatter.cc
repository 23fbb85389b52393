// reduce_scatter, without touching the input.
//  - direct (small payloads): every rank sends block p of its input to rank p at once and
//    folds the n contributions to its own block in rank order: one round of messages
//    instead of n-1 dependent steps, the same bytes per rank as the ring.
//  - ring: partial sums travel in two ping-pong scratch blocks; the last step reduces
//    straight into the output.
//  - cma (3 to 8 ranks on this host over shared memory): each rank folds its block of every
//    peer's input straight out of the peer's memory (cma.cc).
#include <algorithm>
#include <cstring>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/collectives/peer_items.h"
#include "hetobs/collectives/reduce_kernels.h"

namespace hetobs {
namespace {

void direct(Communicator& c, const OpArgs& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtypeSize(a.dtype);
  const Block mine = blockOf(a.send_count, n, r);
  const size_t bytes = mine.count * es;
  // Slot p holds rank p's contribution; our own is copied too, since the output may
  // alias our block of the input and the fold writes the output as it goes.
  uint8_t* in = c.scratch(bytes * size_t(n));
  if (bytes) memcpy(in + size_t(r) * bytes, a.send + mine.offset * es, bytes);
  PeerItems items(n);
  size_t k = 0;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    Block theirs = blockOf(a.send_count, n, p);
    SendItem& s = items.send(k);
    s.peer = p;
    s.data = a.send + theirs.offset * es;
    s.len = theirs.count * es;
    RecvItem& v = items.recv(k);
    v.peer = p;
    v.dst = in + size_t(p) * bytes;
    v.len = bytes;
    ++k;
  }
  c.exchange(items.sends(), k, items.recvs(), k);
  reduceInto(a.dtype, a.redop, a.recv, in, in + bytes, mine.count);
  for (int p = 2; p < n; ++p) reduceInto(a.dtype, a.redop, a.recv, a.recv, in + size_t(p) * bytes, mine.count);
}

void ring(Communicator& c, const OpArgs& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtypeSize(a.dtype);
  const uint8_t* x = a.send;
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  const size_t maxBlock = blockOf(a.send_count, n, 0).count * es;
  uint8_t* pp[2] = {c.scratch(2 * maxBlock), nullptr};
  pp[1] = pp[0] + maxBlock;
  for (int k = 0; k < n - 1; ++k) {
    Block s = blockOf(a.send_count, n, mod(r - k - 1, n));
    Block t = blockOf(a.send_count, n, mod(r - k - 2, n));
    SendItem send{};
    send.peer = right;
    send.data = k == 0 ? x + s.offset * es : pp[(k - 1) % 2];
    send.len = s.count * es;
    RecvItem recv{};
    recv.peer = left;
    recv.dst = k == n - 2 ? a.recv : pp[k % 2];
    recv.local = x + t.offset * es;
    recv.len = t.count * es;
    recv.mode = RecvMode::kReduce;
    recv.dtype = a.dtype;
    recv.redop = a.redop;
    c.exchange(&send, 1, &recv, 1);
  }
}

}  // namespace

void reduceScatter(Communicator& c, const OpArgs& a) {
  const int n = c.size();
  if (n == 1) {
    if (a.recv_count) memcpy(a.recv, a.send, a.recv_count * dtypeSize(a.dtype));
    return;
  }
  const Algorithm algo = chooseAlgorithm(c, a);
  if (algo == Algorithm::kDirect) direct(c, a);
  else if (algo != Algorithm::kCma || !reduceScatterCma(c, a)) ring(c, a);
  if (a.redop == RedOp::kAvg) divideBy(a.dtype, a.recv, a.recv_count, double(n));
}

}  // namespace hetobs
