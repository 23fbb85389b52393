// broadcast: a pipelined chain from the root around the ring. Each middle rank
// receives segment s while forwarding segment s-1, so the time is about
// (bytes + (n-2) x segment) / bandwidth instead of (n-1) x bytes / bandwidth.
#include <algorithm>

#include "hetobs/collectives/algorithm.h"

namespace hetobs {

void broadcast(Communicator& c, const OpArgs& a) {
  const int n = c.size();
  if (n == 1) return;
  const int pos = mod(c.rank() - a.root_or_peer, n);
  const int next = mod(c.rank() + 1, n), prev = mod(c.rank() - 1, n);
  const size_t bytes = a.send_count * dtypeSize(a.dtype);
  const size_t segBytes = chainSegmentBytes(n, bytes);
  const size_t segs = std::max<size_t>(1, (bytes + segBytes - 1) / segBytes);
  auto seg = [&](size_t s, size_t* len) {
    size_t off = s * segBytes;
    *len = std::min(segBytes, bytes - off);
    return a.recv + off;
  };
  for (size_t s = 0; s <= segs; ++s) {
    SendItem send{};
    RecvItem recv{};
    size_t ns = 0, nr = 0;
    // The root sends segment s; a middle rank forwards segment s-1; the last only receives.
    size_t sendSeg = pos == 0 ? s : s - 1;
    bool doSend = pos < n - 1 && (pos == 0 ? s < segs : s >= 1);
    if (doSend) {
      send.peer = next;
      send.data = seg(sendSeg, &send.len);
      send.peerMayRead = chainPeerMayRead(n, bytes);
      send.mayPush = n == 2;  // no middle rank: root and receiver can share the copying
      ns = 1;
    }
    if (pos > 0 && s < segs) {
      recv.peer = prev;
      recv.dst = seg(s, &recv.len);
      nr = 1;
    }
    if (ns || nr) c.exchange(&send, ns, &recv, nr);
  }
}

}  // namespace hetobs
