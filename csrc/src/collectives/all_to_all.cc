// all_to_all: every pair exchanges its block directly, all at once; the progress
// loop interleaves the links so no ordering can deadlock.
#include <cstring>
#include <vector>

#include "hetobs/collectives/algorithm.h"

namespace hetobs {

void allToAll(Communicator& c, const OpArgs& a) {
  const int n = c.size(), r = c.rank();
  const size_t block = a.send_count / size_t(n) * dtypeSize(a.dtype);
  if (block) memcpy(a.recv + size_t(r) * block, a.send + size_t(r) * block, block);
  if (n == 1) return;
  std::vector<SendItem> sends(size_t(n - 1));
  std::vector<RecvItem> recvs(size_t(n - 1));
  size_t k = 0;
  for (int i = 1; i < n; ++i) {
    // Stagger partners so each rank starts with a different peer.
    int to = mod(r + i, n), from = mod(r - i, n);
    sends[k].peer = to;
    sends[k].data = a.send + size_t(to) * block;
    sends[k].len = block;
    recvs[k].peer = from;
    recvs[k].dst = a.recv + size_t(from) * block;
    recvs[k].len = block;
    ++k;
  }
  c.exchange(sends.data(), k, recvs.data(), k);
}

}  // namespace hetobs
