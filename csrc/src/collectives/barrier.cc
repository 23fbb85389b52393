// barrier: an empty message to and from every peer (headers are still checked, so
// a rank calling something else at this sequence id is reported).
#include <vector>

#include "hetobs/collectives/algorithm.h"

namespace hetobs {

void barrier(Communicator& c, const OpArgs&) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  std::vector<SendItem> sends(size_t(n - 1));
  std::vector<RecvItem> recvs(size_t(n - 1));
  size_t k = 0;
  for (int i = 1; i < n; ++i) {
    sends[k].peer = mod(r + i, n);
    recvs[k].peer = mod(r - i, n);
    ++k;
  }
  c.exchange(sends.data(), k, recvs.data(), k);
}

}  // namespace hetobs
