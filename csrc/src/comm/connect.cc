// Building a communicator's channels: one authenticated TCP connection per peer
// (lower ranks accept, higher ranks connect), then shared-memory rings with the
// peers on this host unless HETOBS_TRANSPORT=tcp.
//
// Connections on demand: peers that will use shared memory are connected at once (one
// segment holds a slot for each of them); TCP peers when an op first needs them
// (ensureChannels, with the peers algorithm.cc names), so a ring over 10,000 ranks holds
// two sockets per rank, not 9,999. Both ends of a link run the same op, so both reach
// ensureChannels for each other; the higher rank connects, the lower takes it from its
// listener (which accepts at any time), so the order of peers cannot deadlock.
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "hetobs/comm/communicator.h"
#include "hetobs/comm/endpoint.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/connect_retry.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/transport/shm/channel.h"
#include "hetobs/transport/shm/segment.h"
#include "hetobs/transport/tcp/channel.h"
#include "hetobs/transport/tcp/reconnect.h"

namespace hetobs {
namespace {

constexpr size_t kMaxName = 256;

std::string segmentName(uint64_t commId) {
  uint8_t r[6];
  randomBytes(r, sizeof r);
  return strFormat("/hetobs-%d-%016llx-%02x%02x%02x%02x%02x%02x", int(getpid()), (unsigned long long)commId, r[0],
                   r[1], r[2], r[3], r[4], r[5]);
}

// Once per process: every communicator after the first would repeat the same words.
void warnShmFallback(const PeerInfo& peer, const std::string& why) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) {
    HETOBS_DEBUG("shared memory with %s unusable (%s): TCP", peer.describe().c_str(), why.c_str());
    return;
  }
  HETOBS_WARN("shared memory with %s is unusable (%s): this pair uses TCP (a private /dev/shm, as in a container "
              "with host networking?)", peer.describe().c_str(), why.c_str());
}

}  // namespace

// Authenticated TCP connections to `want` (ascending comm ranks, not us) into fds[p].
void Communicator::connectPeers(const std::vector<int>& want, std::vector<int>& fds, int64_t deadline, bool inOp) {
  const auto& cards = endpoint_->cards();
  // Connect to lower ranks; their listener threads accept concurrently, so no ordering deadlock.
  for (int p : want) {
    if (p > rank_) break;
    const Card& c = cards[size_t(global_[size_t(p)])];
    try {
      Hello h;
      h.purpose = Purpose::kTransport;
      h.comm_id = id_;
      h.from_rank = rank_;
      h.to_rank = p;
      // A listener busy with a whole host's ranks dialling at once may drop us before it
      // answers: dialled again, never a failed start-up.
      fds[size_t(p)] = dialAndShake(ConnectTarget{SockAddr{c.ip, c.port}, p, "rank " + std::to_string(p)},
                                    endpoint_->credentials(), h, deadline);
    } catch (const Error& e) {
      throw Error(strFormat("comm %llu: connecting to %s: %s", (unsigned long long)id_,
                            peerInfo_[size_t(p)].describe().c_str(), e.what()));
    }
  }
  for (int p : want) {
    if (p < rank_) continue;
    int fd = endpoint_->listener().take(id_, p, deadline);
    if (fd < 0 && inOp) {  // on demand: the peer has not reached the op within its timeout
      failure_.waitedPeer = p;
      failure_.timedOutOn.assign(1, p);
      throw TimeoutError(strFormat("timed out after %.2f s waiting for %s to connect (it has not reached this op)",
                                   double(monoNs() - opStartNs_) / 1e9, peerInfo_[size_t(p)].describe().c_str()));
    }
    if (fd < 0)
      throw Error(strFormat("comm %llu: %s never connected (connect timeout %.1f s)", (unsigned long long)id_,
                            peerInfo_[size_t(p)].describe().c_str(), config().connect_timeout_s));
    fds[size_t(p)] = fd;
  }
}

// A TCP channel to comm rank p over fd, able to re-make its connection after a break.
std::unique_ptr<Channel> Communicator::makeTcpChannel(int p, int fd) {
  const auto& cards = endpoint_->cards();
  const Card& c = cards[size_t(global_[size_t(p)])];
  const Card& me = cards[size_t(global_[size_t(rank_)])];
  tcp::ReconnectPlan plan;
  plan.comm_id = id_;
  plan.my_rank = rank_;
  plan.peer_rank = p;
  plan.my_host = me.hostname;
  plan.peer_listener = SockAddr{c.ip, c.port};
  plan.cred = endpoint_->credentials();
  plan.listener = &endpoint_->listener();
  plan.timeout_s = netSettings().reconnect_timeout;
  plan.same_host = c.host_key == me.host_key;
  return std::make_unique<tcp::TcpChannel>(peerInfo_[size_t(p)], fd, std::make_unique<tcp::Reconnector>(plan));
}

void Communicator::ensureChannels(const std::vector<int>& want) {
  std::vector<int>& missing = missingScratch_;
  missing.clear();
  for (int p : want)
    if (p != rank_ && !channels_[size_t(p)]) missing.push_back(p);
  if (missing.empty()) return;
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  std::vector<int> fds(channels_.size(), -1);
  // A peer may reach this op later than we do: wait as long as the op may.
  try {
    connectPeers(missing, fds, deadlineNs_, true);
  } catch (...) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    throw;
  }
  Runtime* rt = Runtime::get();
  for (int p : missing) {
    std::unique_ptr<Channel> ch = makeTcpChannel(p, fds[size_t(p)]);
    fds[size_t(p)] = -1;
    ch->bindStats(rt ? rt->stats().allocLink() : nullptr, id_);
    ch->bindArrival(&arrival_);
    // Observers (dumps, links()) walk channels_ under observeMu_: a slot filled on demand
    // is filled under it too (once per peer, never on an op's data path).
    std::lock_guard<std::mutex> g(observeMu_);
    channels_[size_t(p)] = std::move(ch);
    anyTcp_ = true;
  }
  HETOBS_DEBUG("comm %llu: rank %d connected to %zu more peer(s) on demand", (unsigned long long)id_, rank_,
               missing.size());
}

void Communicator::buildChannels() {
  const CommConfig& cfg = config();
  const auto& cards = endpoint_->cards();
  const int n = size();
  int64_t deadline = endpoint_->connectDeadline();
  std::vector<int> fds(static_cast<size_t>(n), -1);
  peerInfo_.assign(size_t(n), PeerInfo{});
  for (int p = 0; p < n; ++p) {
    const Card& c = cards[size_t(global_[size_t(p)])];
    peerInfo_[size_t(p)] = PeerInfo{p, global_[size_t(p)], c.hostname, c.pid};
  }
  const std::vector<PeerInfo>& peers = peerInfo_;
  try {
    // Which peers share this host's memory: connected now; the others on first use.
    std::vector<int> local;  // comm ranks on this host, excluding us, ascending
    const std::string& myKey = cards[size_t(global_[size_t(rank_)])].host_key;
    oneHostShm_ = cfg.transport != TransportChoice::kTcp;
    for (int p = 0; p < n; ++p) oneHostShm_ &= cards[size_t(global_[size_t(p)])].host_key == myKey;
    for (int p = 0; p < n; ++p) {
      if (p == rank_) continue;
      bool same = cards[size_t(global_[size_t(p)])].host_key == myKey;
      if (cfg.transport == TransportChoice::kShm && !same)
        throw Error(strFormat("HETOBS_TRANSPORT=shm, but %s is on another host (%s); use auto or tcp",
                              peers[size_t(p)].describe().c_str(), peers[size_t(p)].host.c_str()));
      if (same && cfg.transport != TransportChoice::kTcp) local.push_back(p);
    }
    connectPeers(local, fds, deadline, false);

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
        try {
          theirs[size_t(p)] = std::shared_ptr<shm::Segment>(shm::Segment::open(msg.substr(0, nl)));
        } catch (const Error& e) {
          if (cfg.transport == TransportChoice::kShm)
            throw Error(std::string(e.what()) + " (HETOBS_TRANSPORT=shm; auto falls back to TCP)");
          // Same boot id and network namespace but another /dev/shm (a container with host
          // networking): this pair talks over its TCP connection instead.
          warnShmFallback(peers[size_t(p)], e.what());
          continue;
        }
        outSlot[size_t(p)] = uint32_t(std::stoul(msg.substr(nl + 1)));
        if (outSlot[size_t(p)] >= theirs[size_t(p)]->header()->nslots) throw Error("shm set-up: slot out of range");
      }
      // Once every peer has mapped our segment (or said it cannot), drop its name: nothing is
      // left in /dev/shm. A pair uses shm only when both sides mapped the other's segment.
      for (int p : local) writeBlob(fds[size_t(p)], theirs[size_t(p)] ? "mapped" : "unmapped", deadline, "shm set-up");
      std::vector<int> shmPeers;
      for (int p : local) {
        std::string reply = readBlob(fds[size_t(p)], 16, deadline, "shm set-up");
        if (reply != "mapped" && reply != "unmapped") throw Error("shm set-up: bad reply");
        if (reply == "mapped" && theirs[size_t(p)]) shmPeers.push_back(p);
        else if (theirs[size_t(p)]) {
          warnShmFallback(peers[size_t(p)], "the peer cannot open this rank's shared memory");
          theirs[size_t(p)].reset();
        }
      }
      segment_->unlink();
      channels_.resize(size_t(n));
      for (size_t i = 0; i < local.size(); ++i) {
        int p = local[i];
        if (!theirs[size_t(p)]) continue;
        channels_[size_t(p)] = std::make_unique<shm::ShmChannel>(peers[size_t(p)], fds[size_t(p)], segment_.get(),
                                                                 theirs[size_t(p)], outSlot[size_t(p)], uint32_t(i));
        fds[size_t(p)] = -1;
        anyShm_ = true;
      }
      if (shmPeers.empty()) segment_.reset();
    }
    channels_.resize(size_t(n));
    for (int p = 0; p < n; ++p) {
      if (fds[size_t(p)] < 0) continue;
      channels_[size_t(p)] = makeTcpChannel(p, fds[size_t(p)]);
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
