#include "hetobs/transport/channel.h"

namespace hetobs {

std::string PeerInfo::describe() const {
  return strFormat("rank %d (host %s, pid %d)", rank, host.c_str(), pid);
}

void checkFrame(const PeerInfo& peer, const OpDesc& theirs, const OpDesc& expect) {
  if (theirs == expect) return;
  throw FrameMismatch(peer.rank, theirs, expect,
                      strFormat("%s sent %s; this rank runs %s", peer.describe().c_str(), theirs.str().c_str(),
                                expect.str().c_str()));
}

}  // namespace hetobs
