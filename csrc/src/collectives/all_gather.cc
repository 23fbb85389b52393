// all_gather: ring, n-1 steps; each rank forwards the block it received last step.
#include <cstring>

#include "hetobs/collectives/algorithm.h"

namespace hetobs {

void allGather(Communicator& c, const OpArgs& a) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = a.send_count * dtypeSize(a.dtype);
  uint8_t* out = a.recv;
  if (bytes && out + size_t(r) * bytes != a.send) memcpy(out + size_t(r) * bytes, a.send, bytes);
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

}  // namespace hetobs
