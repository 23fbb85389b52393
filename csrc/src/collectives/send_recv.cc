// send / recv: one message; the frame header carries the per-pair p2p sequence id,
// so a send matched with the wrong recv (count, dtype) is an error on both sides.
#include "hetobs/collectives/algorithm.h"

namespace hetobs {

void sendRecv(Communicator& c, const OpArgs& a) {
  if (a.op == OpKind::kSend) {
    SendItem s{};
    s.peer = a.root_or_peer;
    s.data = a.send;
    s.len = a.send_count * dtypeSize(a.dtype);
    c.exchange(&s, 1, nullptr, 0);
  } else {
    RecvItem r{};
    r.peer = a.root_or_peer;
    r.dst = a.recv;
    r.len = a.recv_count * dtypeSize(a.dtype);
    c.exchange(nullptr, 0, &r, 1);
  }
}

}  // namespace hetobs
