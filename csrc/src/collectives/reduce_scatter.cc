// reduce_scatter: ring without touching the input. Partial sums travel in two
// ping-pong scratch blocks; the last step reduces straight into the output.
#include <algorithm>
#include <cstring>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/collectives/reduce_kernels.h"

namespace hetobs {

void reduceScatter(Communicator& c, const OpArgs& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtypeSize(a.dtype);
  const uint8_t* x = a.send;
  if (n == 1) {
    if (a.recv_count) memcpy(a.recv, x, a.recv_count * es);
    return;
  }
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
  if (a.redop == RedOp::kAvg) divideBy(a.dtype, a.recv, a.recv_count, double(n));
}

}  // namespace hetobs
