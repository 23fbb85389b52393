#include "hetobs/transport/channel.h"

#include <cstdio>

namespace hetobs {

Channel::Channel(PeerInfo peer)
    : peer_(std::move(peer)), ownStats_(std::make_unique<stats::LinkStats>()), stats_(ownStats_.get()) {}

void Channel::bindStats(stats::LinkStats* slot, uint64_t commId) {
  if (slot) stats_ = slot;
  stats_->comm_id = commId;
  stats_->peer = peer_.rank;
  stats_->global_peer = peer_.global_rank;
  snprintf(stats_->transport, sizeof stats_->transport, "%s", kind());
}

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
