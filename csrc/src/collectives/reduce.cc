// reduce: a pipelined chain ending at the root. The rank after the root starts;
// each rank adds its contribution to the partial result as segments pass through
// (in scratch, so non-root inputs stay untouched); the root reduces into its buffer.
#include <algorithm>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/collectives/reduce_kernels.h"

namespace hetobs {

void reduce(Communicator& c, const OpArgs& a) {
  const int n = c.size();
  const size_t es = dtypeSize(a.dtype);
  const size_t bytes = a.send_count * es;
  if (n == 1) {
    if (a.redop == RedOp::kAvg) divideBy(a.dtype, a.recv, a.send_count, 1.0);
    return;
  }
  const int root = a.root_or_peer;
  const int pos = mod(c.rank() - root - 1, n);  // 0 starts the chain; n-1 is the root
  const int next = mod(c.rank() + 1, n), prev = mod(c.rank() - 1, n);
  const size_t segBytes = chainSegmentBytes(n, bytes);
  const size_t segs = std::max<size_t>(1, (bytes + segBytes - 1) / segBytes);
  uint8_t* partial = pos == 0 || pos == n - 1 ? nullptr : c.scratch(bytes);
  auto segLen = [&](size_t s) { return std::min(segBytes, bytes - s * segBytes); };
  for (size_t s = 0; s <= segs; ++s) {
    SendItem send{};
    RecvItem recv{};
    size_t ns = 0, nr = 0;
    if (pos == 0 && s < segs) {
      send.peer = next;
      send.data = a.send + s * segBytes;
      send.len = segLen(s);
      ns = 1;
    } else if (pos > 0 && pos < n - 1 && s >= 1) {
      send.peer = next;
      send.data = partial + (s - 1) * segBytes;
      send.len = segLen(s - 1);
      ns = 1;
    }
    if (pos > 0 && s < segs) {
      recv.peer = prev;
      size_t off = s * segBytes;
      recv.dst = pos == n - 1 ? a.recv + off : partial + off;
      recv.local = a.send + off;
      recv.len = segLen(s);
      recv.mode = RecvMode::kReduce;
      recv.dtype = a.dtype;
      recv.redop = a.redop;
      nr = 1;
    }
    send.peerMayRead = chainPeerMayRead(n, bytes);
    if (ns || nr) c.exchange(&send, ns, &recv, nr);
  }
  if (pos == n - 1 && a.redop == RedOp::kAvg) divideBy(a.dtype, a.recv, a.send_count, double(n));
}

}  // namespace hetobs
