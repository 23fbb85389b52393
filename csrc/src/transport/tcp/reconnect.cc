#include "hetobs/transport/tcp/reconnect.h"

#include <unistd.h>

#include <algorithm>

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
  ConnectTarget target{plan_.peer_listener, plan_.peer_rank, peer.describe()};
  for (int attempt = 1;; ++attempt) {
    RetryLimits limits;
    limits.refused_for_ns = refusedForNs();
    limits.attempts = 1000000;  // the reconnect deadline bounds it, not HETOBS_CONNECT_RETRIES
    int fd;
    try {
      fd = connectWithRetries(target, deadlineNs, limits);
    } catch (const ConnectError& e) {
      if (e.err == ECONNREFUSED)
        throw gonePeer(peer, plan_.peer_rank, e.address);
      throw;
    }
    try {
      Hello h;
      h.purpose = Purpose::kTransport;
      h.comm_id = plan_.comm_id;
      h.from_rank = plan_.my_rank;
      h.to_rank = plan_.peer_rank;
      h.generation = generation;
      clientHandshake(fd, plan_.cred, h, deadlineNs);
      return fd;
    } catch (const AuthError&) {
      ::close(fd);
      throw;
    } catch (const Error& e) {
      // Reset during the handshake: the network is still flapping. Try again.
      ::close(fd);
      int64_t wait = retryBackoffNs(attempt + 1);
      if (monoNs() + wait >= deadlineNs) throw;
      HETOBS_DEBUG("re-handshake with %s failed (%s); retrying", peer.describe().c_str(), e.what());
      usleep(useconds_t(wait / 1000));
    }
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
      probe = connectWithRetries(ConnectTarget{plan_.peer_listener, plan_.peer_rank, peer.describe()}, deadlineNs,
                                 limits);
      Hello h;
      h.purpose = Purpose::kProbe;
      clientHandshake(probe, plan_.cred, h, deadlineNs);
    } catch (const ConnectError& e) {
      if (e.err == ECONNREFUSED)
        throw gonePeer(peer, plan_.peer_rank, e.address);
      // Unreachable for now: keep waiting for its redial until the deadline.
    } catch (const AuthError&) {
      if (probe >= 0) ::close(probe);
      throw;
    } catch (const Error&) {
      // Dropped during the probe: a flapping network or a dying process. Probe again.
    }
    if (probe >= 0) ::close(probe);
    int64_t now = monoNs();
    if (now >= deadlineNs) return -1;
    fd = plan_.listener->take(plan_.comm_id, plan_.peer_rank, std::min(deadlineNs, now + reprobeNs));
    if (fd >= 0) return fd;
    reprobeNs = std::min(reprobeNs * 2, kMaxReprobeNs);
  }
}

int Reconnector::remake(uint32_t generation, int64_t deadlineNs, const PeerInfo& peer, const std::string& why,
                        const std::string& oldLocal, const std::string& oldRemote) {
  int fd = -1;
  try {
    fd = dialer() ? dial(generation, deadlineNs, peer) : await(deadlineNs, peer);
  } catch (const PeerError& e) {
    if (e.closed) throw;  // the peer is gone: the error it always was
    fd = -1;
  } catch (const AuthError&) {
    throw;
  } catch (const Error&) {
    fd = -1;
  }
  if (fd >= 0) return fd;
  std::string local = strFormat("rank %d (host %s, %s)", plan_.my_rank, plan_.my_host.c_str(),
                                oldLocal.empty() ? "?" : oldLocal.c_str());
  std::string remote = strFormat("rank %d (host %s, %s)", plan_.peer_rank, peer.host.c_str(),
                                 oldRemote.empty() ? plan_.peer_listener.str().c_str() : oldRemote.c_str());
  throw LinkError(strFormat("link %s <-> %s is down: it broke (%s) and could not be re-made within "
                            "HETOBS_RECONNECT_TIMEOUT=%g s",
                            local.c_str(), remote.c_str(), why.c_str(), plan_.timeout_s),
                  plan_.peer_rank, local, remote);
}

int Reconnector::takeParked() {
  if (!enabled() || dialer()) return -1;
  return plan_.listener->take(plan_.comm_id, plan_.peer_rank, monoNs());
}

}  // namespace tcp
}  // namespace hetobs
