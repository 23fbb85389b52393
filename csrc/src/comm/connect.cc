// Building a communicator's channels: one authenticated TCP connection per peer
// (lower ranks accept, higher ranks connect), then shared-memory rings with the
// peers on this host unless HETOBS_TRANSPORT=tcp.
#include <unistd.h>

#include <algorithm>

#include "hetobs/comm/communicator.h"
#include "hetobs/comm/endpoint.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"
#include "hetobs/transport/shm/channel.h"
#include "hetobs/transport/shm/segment.h"
#include "hetobs/transport/tcp/channel.h"

namespace hetobs {
namespace {

constexpr size_t kMaxName = 256;

std::string segmentName(uint64_t commId) {
  uint8_t r[6];
  randomBytes(r, sizeof r);
  return strFormat("/hetobs-%d-%016llx-%02x%02x%02x%02x%02x%02x", int(getpid()), (unsigned long long)commId, r[0],
                   r[1], r[2], r[3], r[4], r[5]);
}

}  // namespace

void Communicator::buildChannels() {
  const CommConfig& cfg = config();
  const auto& cards = endpoint_->cards();
  const int n = size();
  int64_t deadline = endpoint_->connectDeadline();
  std::vector<int> fds(static_cast<size_t>(n), -1);
  std::vector<PeerInfo> peers(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    const Card& c = cards[size_t(global_[size_t(p)])];
    peers[size_t(p)] = PeerInfo{p, global_[size_t(p)], c.hostname, c.pid};
  }
  try {
    // Connect to lower ranks; their listener threads accept concurrently, so no ordering deadlock.
    for (int p = 0; p < rank_; ++p) {
      const Card& c = cards[size_t(global_[size_t(p)])];
      int fd = connectTcp(SockAddr{c.ip, c.port}, deadline);
      fds[size_t(p)] = fd;
      Hello h;
      h.purpose = Purpose::kTransport;
      h.comm_id = id_;
      h.from_rank = rank_;
      h.to_rank = p;
      clientHandshake(fd, endpoint_->credentials(), h, deadline);
    }
    for (int p = rank_ + 1; p < n; ++p) {
      int fd = endpoint_->listener().take(id_, p, deadline);
      if (fd < 0)
        throw Error(strFormat("comm %llu: %s never connected (connect timeout %.1f s)", (unsigned long long)id_,
                              peers[size_t(p)].describe().c_str(), cfg.connect_timeout_s));
      fds[size_t(p)] = fd;
    }

    // Which peers share this host's memory.
    std::vector<int> local;  // comm ranks on this host, excluding us, ascending
    const std::string& myKey = cards[size_t(global_[size_t(rank_)])].host_key;
    for (int p = 0; p < n; ++p) {
      if (p == rank_) continue;
      bool same = cards[size_t(global_[size_t(p)])].host_key == myKey;
      if (cfg.transport == TransportChoice::kShm && !same)
        throw Error(strFormat("HETOBS_TRANSPORT=shm, but %s is on another host (%s); use auto or tcp",
                              peers[size_t(p)].describe().c_str(), peers[size_t(p)].host.c_str()));
      if (same && cfg.transport != TransportChoice::kTcp) local.push_back(p);
    }

    std::vector<std::shared_ptr<shm::Segment>> theirs(static_cast<size_t>(n));
    if (!local.empty()) {
      uint64_t ring = cfg.shm_ring_bytes;
      if (local.size() > 8) ring = std::max<uint64_t>(256 << 10, (32ull << 20) / local.size());
      ring = (ring + 63) & ~uint64_t(63);
      segment_ = shm::Segment::create(segmentName(id_), uint32_t(local.size()), ring);
      // Tell each local peer our segment name and which slot in it is theirs.
      for (size_t i = 0; i < local.size(); ++i)
        writeBlob(fds[size_t(local[i])], segment_->name() + "\n" + std::to_string(i), deadline, "shm set-up");
      std::vector<uint32_t> outSlot(static_cast<size_t>(n), 0);
      for (int p : local) {
        std::string msg = readBlob(fds[size_t(p)], kMaxName, deadline, "shm set-up");
        size_t nl = msg.find('\n');
        if (nl == std::string::npos) throw Error("shm set-up: malformed segment announcement");
        theirs[size_t(p)] = std::shared_ptr<shm::Segment>(shm::Segment::open(msg.substr(0, nl)));
        outSlot[size_t(p)] = uint32_t(std::stoul(msg.substr(nl + 1)));
        if (outSlot[size_t(p)] >= theirs[size_t(p)]->header()->nslots) throw Error("shm set-up: slot out of range");
      }
      // Once every peer has mapped our segment, drop its name: nothing is left in /dev/shm.
      for (int p : local) writeBlob(fds[size_t(p)], "mapped", deadline, "shm set-up");
      for (int p : local) {
        if (readBlob(fds[size_t(p)], 16, deadline, "shm set-up") != "mapped") throw Error("shm set-up: bad reply");
      }
      segment_->unlink();
      channels_.resize(size_t(n));
      for (size_t i = 0; i < local.size(); ++i) {
        int p = local[i];
        channels_[size_t(p)] = std::make_unique<shm::ShmChannel>(peers[size_t(p)], fds[size_t(p)], segment_.get(),
                                                                 theirs[size_t(p)], outSlot[size_t(p)], uint32_t(i));
        fds[size_t(p)] = -1;
        anyShm_ = true;
      }
    }
    channels_.resize(size_t(n));
    for (int p = 0; p < n; ++p) {
      if (fds[size_t(p)] < 0) continue;
      channels_[size_t(p)] = std::make_unique<tcp::TcpChannel>(peers[size_t(p)], fds[size_t(p)]);
      fds[size_t(p)] = -1;
      anyTcp_ = true;
    }
  } catch (...) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    channels_.clear();
    segment_.reset();
    throw;
  }
  HETOBS_DEBUG("comm %llu: rank %d of %d connected (%s%s)", (unsigned long long)id_, rank_, n, anyShm_ ? "shm " : "",
               anyTcp_ ? "tcp" : "");
}

}  // namespace hetobs
