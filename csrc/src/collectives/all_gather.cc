// all_gather.
//  - direct (small payloads): every rank sends its block to every other at once and
//    receives theirs into place: one round of messages instead of n-1 dependent steps
//    (each a wake-up of the next rank), the same bytes per rank as the ring.
//  - ring: n-1 steps; each rank forwards the block it received last step.
#include <cstring>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/collectives/peer_items.h"

namespace hetobs {
namespace {

void direct(Communicator& c, const OpArgs& a, size_t bytes) { exchangeWithEveryPeer(c, a.send, bytes, a.recv); }

void ring(Communicator& c, const OpArgs& a, size_t bytes) {
  const int n = c.size(), r = c.rank();
  uint8_t* out = a.recv;
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int k = 0; k < n - 1; ++k) {
    SendItem send{};
    send.peer = right;
    send.data = out + size_t(mod(r - k, n)) * bytes;
    send.len = bytes;
    RecvItem recv{};
    recv.peer = left;
    recv.dst = out + size_t(mod(r - k - 1, n)) * bytes;
    recv.len = bytes;
    c.exchange(&send, 1, &recv, 1);
  }
}

}  // namespace

void allGather(Communicator& c, const OpArgs& a) {
  const int r = c.rank();
  const size_t bytes = a.send_count * dtypeSize(a.dtype);
  uint8_t* out = a.recv;
  if (bytes && out + size_t(r) * bytes != a.send) memcpy(out + size_t(r) * bytes, a.send, bytes);
  if (c.size() == 1) return;
  if (chooseAlgorithm(c, a) == Algorithm::kDirect) return direct(c, a, bytes);
  ring(c, a, bytes);
}

}  // namespace hetobs
