#include "hetobs/transport/tcp/reconnect.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "hetobs/bootstrap/listener.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/connect_retry.h"
#include "hetobs/common/log.h"

namespace hetobs {
namespace tcp {
namespace {

// How long a refusal from another host must last before the peer counts as gone. A killed
// process refuses every attempt at once; a firewall resetting for a moment (the faults this
// survives) may refuse a few. Long enough for a blip, short enough that a death still fails
// in ~1.5 s. On the same host (same kernel and network namespace) nothing stands between
// the two ends: the first refusal means nobody listens, and a death fails at once.
constexpr int64_t kRefusedForNs = 1500000000LL;

}  // namespace

int64_t Reconnector::refusedForNs() const { return plan_.same_host ? 0 : kRefusedForNs; }

// Gone: its listener refused every dial for the whole window. A try whose own deadline ended
// while refusals were still being timed (a short background try, a reset burst answering SYNs
// with RST) has not shown that alone: a 1 s burst once ended a job this way, its peer alive.
bool Reconnector::refusedThroughout(const ConnectError& e) {
  if (e.err != ECONNREFUSED) {
    refusedSinceNs_ = -1;
    return false;
  }
  const int64_t now = monoNs();
  if (refusedSinceNs_ < 0 || now - e.refused_ns < refusedSinceNs_) refusedSinceNs_ = now - e.refused_ns;
  return now - refusedSinceNs_ >= refusedForNs();
}

void ReconnectLog::addLocked(const char* stage, std::string what, int err, int64_t refusedNs) {
  if (h_.events.size() == kEvents) h_.events.erase(h_.events.begin());  // the latest few tell the story
  h_.events.push_back(ReconnectHistory::Event{wallNs(), stage, err, refusedNs, std::move(what)});
}

void ReconnectLog::broke(const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  ++h_.breaks;
  h_.state = "re-making";
  addLocked("broke", "broke: " + why);
}

void ReconnectLog::failed(const char* stage, const std::string& detail, int err, int64_t refusedNs) {
  std::lock_guard<std::mutex> g(mu_);
  addLocked(stage, strFormat("%s: %s", stage, detail.c_str()), err, refusedNs);
}

void ReconnectLog::attempted(uint64_t n) {
  std::lock_guard<std::mutex> g(mu_);
  h_.attempts += n;
}

void ReconnectLog::remade() {
  std::lock_guard<std::mutex> g(mu_);
  h_.state = "up";
}

void ReconnectLog::ended(const char* state, const std::string& what, int err) {
  std::lock_guard<std::mutex> g(mu_);
  h_.state = state;
  addLocked("end", what, err);
}

ReconnectHistory ReconnectLog::snapshot() const {
  std::lock_guard<std::mutex> g(mu_);
  return h_;
}

namespace {
// The PeerError of a peer whose listener refused every dial: its process is gone.
PeerError gonePeer(const PeerInfo& peer, int rank, const std::string& address) {
  PeerError e(strFormat("%s is gone: its listener at %s refuses connections", peer.describe().c_str(), address.c_str()),
              rank, true);
  e.gone = true;
  return e;
}
}  // namespace

int Reconnector::dial(uint32_t generation, int64_t deadlineNs, const PeerInfo& peer) {
  RetryLimits limits;
  limits.refused_for_ns = refusedForNs();
  limits.attempts = 1000000;  // the reconnect deadline bounds it, not HETOBS_CONNECT_RETRIES
  Hello h;
  h.purpose = Purpose::kTransport;
  h.comm_id = plan_.comm_id;
  h.from_rank = plan_.my_rank;
  h.to_rank = plan_.peer_rank;
  h.generation = generation;
  // A reset during the handshake (the network still flapping) is dialled again inside.
  log_.attempted();
  try {
    int fd = dialAndShake(ConnectTarget{plan_.peer_listener, plan_.peer_rank, peer.describe()}, plan_.cred, h,
                          deadlineNs, limits, [this](const std::string& why) {
                            log_.attempted();
                            log_.failed("dial", why);
                          });
    refusedSinceNs_ = -1;
    return fd;
  } catch (const ConnectError& e) {
    log_.attempted(uint64_t(std::max(0, e.attempts - 1)));  // its connects, past the one counted above
    log_.failedConnect("dial", e);
    if (refusedThroughout(e)) throw gonePeer(peer, plan_.peer_rank, e.address);
    throw;  // a refusal cut short by this try's deadline proves nothing (a reset burst refuses too)
  } catch (const Error& e) {
    log_.failed("dial", e.what());
    refusedSinceNs_ = -1;  // connected, then failed: something listens there
    throw;
  }
}

int Reconnector::await(int64_t deadlineNs, const PeerInfo& peer) {
  // Nobody redials a dead peer's link: ask its listener whether the process is still there
  // (refused = gone) before and while waiting for its redial. A dying process may still
  // accept into its backlog and then drop the probe: that proves nothing, so probe again,
  // soon: a process being torn down refuses a few ms later, and waiting the full re-probe
  // interval after each drop added 0.5 s to every death noticed that way (a loaded CI
  // machine, slow to tear the killed rank down, took 2.04 s instead of 1.54 s).
  constexpr int64_t kFirstReprobeNs = 50000000LL;
  constexpr int64_t kMaxReprobeNs = 500000000LL;
  int64_t reprobeNs = kFirstReprobeNs;
  for (;;) {
    int fd = plan_.listener->take(plan_.comm_id, plan_.peer_rank, monoNs());
    if (fd >= 0) return fd;
    int probe = -1;
    try {
      RetryLimits limits;
      limits.refused_for_ns = refusedForNs();
      limits.attempts = 1000000;
      log_.attempted();
      probe = connectWithRetries(ConnectTarget{plan_.peer_listener, plan_.peer_rank, peer.describe()}, deadlineNs,
                                 limits);
      refusedSinceNs_ = -1;  // something listens there
      // About this link: a peer that closed the communicator says so (CommClosedError).
      Hello h;
      h.purpose = Purpose::kProbe;
      h.comm_id = plan_.comm_id;
      h.from_rank = plan_.my_rank;
      h.to_rank = plan_.peer_rank;
      clientHandshake(probe, plan_.cred, h, deadlineNs);
    } catch (const ConnectError& e) {
      log_.attempted(uint64_t(std::max(0, e.attempts - 1)));
      log_.failedConnect("probe", e);
      if (refusedThroughout(e)) throw gonePeer(peer, plan_.peer_rank, e.address);
      // Unreachable for now, or refused for less than the window: keep waiting for its redial.
    } catch (const AuthError&) {
      if (probe >= 0) ::close(probe);
      throw;
    } catch (const CommClosedError&) {
      if (probe >= 0) ::close(probe);
      throw;
    } catch (const Error& e) {
      // Dropped during the probe: a flapping network or a dying process. Probe again.
      log_.failed("probe", e.what());
    }
    if (probe >= 0) ::close(probe);
    int64_t now = monoNs();
    if (now >= deadlineNs) return -1;
    fd = plan_.listener->take(plan_.comm_id, plan_.peer_rank, std::min(deadlineNs, now + reprobeNs));
    if (fd >= 0) return fd;
    reprobeNs = std::min(reprobeNs * 2, kMaxReprobeNs);
  }
}

int Reconnector::tryRemake(uint32_t generation, int64_t deadlineNs, const PeerInfo& peer, const std::string& why) {
  try {
    return dialer() ? dial(generation, deadlineNs, peer) : await(deadlineNs, peer);
  } catch (const PeerError& e) {
    if (e.closed) {  // the peer is gone: the error it always was
      log_.ended("closed", e.what(), e.gone ? ECONNREFUSED : 0);
      throw;
    }
    return -1;
  } catch (const CommClosedError& e) {
    // It closed the communicator (or it failed there) while the link was down: the close
    // message was lost with the connection, the listener said it instead.
    log_.ended("closed", e.what());
    throw PeerError(strFormat("%s closed its connection (its communicator %llu is closed there; the link broke "
                              "first: %s)",
                              peer.describe().c_str(), (unsigned long long)plan_.comm_id, why.c_str()),
                    plan_.peer_rank, true);
  } catch (const AuthError& e) {
    log_.ended("down", e.what());
    throw;
  } catch (const Error&) {
    return -1;
  }
}

int Reconnector::remake(uint32_t generation, int64_t deadlineNs, const PeerInfo& peer, const std::string& why,
                        const std::string& oldLocal, const std::string& oldRemote) {
  int fd = tryRemake(generation, deadlineNs, peer, why);
  if (fd >= 0) return fd;
  std::string local = strFormat("rank %d (host %s, %s)", plan_.my_rank, plan_.my_host.c_str(),
                                oldLocal.empty() ? "?" : oldLocal.c_str());
  std::string remote = strFormat("rank %d (host %s, %s)", plan_.peer_rank, peer.host.c_str(),
                                 oldRemote.empty() ? plan_.peer_listener.str().c_str() : oldRemote.c_str());
  ReconnectHistory h = log_.snapshot();
  std::string last = h.events.empty() ? std::string("none") : h.events.back().what;
  std::string msg = strFormat("link %s <-> %s is down: it broke (%s) and could not be re-made within "
                              "HETOBS_RECONNECT_TIMEOUT=%g s (%llu attempts; last: %s)",
                              local.c_str(), remote.c_str(), why.c_str(), plan_.timeout_s,
                              (unsigned long long)h.attempts, last.c_str());
  log_.ended("down", strFormat("gave up after HETOBS_RECONNECT_TIMEOUT=%g s", plan_.timeout_s));
  throw LinkError(msg, plan_.peer_rank, local, remote);
}

int Reconnector::takeParked() {
  if (!enabled() || dialer()) return -1;
  return plan_.listener->take(plan_.comm_id, plan_.peer_rank, monoNs());
}

}  // namespace tcp
}  // namespace hetobs
