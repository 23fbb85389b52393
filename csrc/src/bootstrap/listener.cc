#include "hetobs/bootstrap/listener.h"

#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"

namespace hetobs {
namespace {
// A handshake must finish quickly: a stalled stranger holds its own thread no longer.
constexpr int64_t kHandshakeNs = 2000000000LL;
}  // namespace

Listener::Listener(Credentials cred, const std::string& bindHost, size_t peers)
    : cred_(std::move(cred)), pool_(pendingBudget(peers)) {
  // Every same-host peer dials at once when a communicator is built: a full accept queue
  // drops their SYNs, each then waiting a second or more to try again.
  fd_ = listenTcp(bindHost, 0, &addr_, int(std::min<size_t>(128 + peers, 65535)));
  if (pipe2(wake_, O_CLOEXEC) != 0) throw Error("pipe2: " + errnoString(errno));
  thread_ = std::thread([this] { loop(); });
}

Listener::~Listener() {
  char c = 1;
  ssize_t rc = write(wake_[1], &c, 1);
  (void)rc;
  if (thread_.joinable()) thread_.join();
  pool_.stop();  // no handler parks a connection after this
  close(fd_);
  close(wake_[0]);
  close(wake_[1]);
  for (auto& kv : parked_) close(kv.second);
}

void Listener::loop() {
  sigset_t all;  // keep signals (stack dumps, the dump signal) for the application's threads
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  for (;;) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int rc = poll(p, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      HETOBS_WARN("listener poll failed: %s", errnoString(errno).c_str());
      return;
    }
    if (p[1].revents) return;
    if (p[0].revents & POLLIN) {
      int cfd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (cfd < 0) continue;
      pool_.run(cfd, [this](int fd, const std::function<void()>& authenticated) { return handle(fd, authenticated); });
    }
  }
}

bool Listener::handle(int cfd, const std::function<void()>& authenticated) {
  std::string from = peerAddressOf(cfd);
  try {
    Credentials cred;
    {
      std::lock_guard<std::mutex> g(mu_);
      cred = cred_;
    }
    bool closedComm = false;
    Hello h = serverHandshake(cfd, cred, monoNs() + kHandshakeNs, [&](const Hello& x) {
      authenticated();
      // A (re)connection for a communicator closed here, or a reconnect probe about one (it
      // names its rank), hears so: the link's deliberate close, when the close message itself
      // was lost with the connection.
      bool aboutComm = x.purpose == Purpose::kTransport || (x.purpose == Purpose::kProbe && x.from_rank >= 0);
      std::lock_guard<std::mutex> g(mu_);
      closedComm = aboutComm && closedComms_.count(x.comm_id) > 0;
      return closedComm ? kHandshakeCommClosed : kHandshakeAccepted;
    });
    if (closedComm || h.purpose == Purpose::kProbe) return false;
    if (h.purpose == Purpose::kControl) {
      int64_t dl = monoNs() + kHandshakeNs;
      std::string request = readBlob(cfd, 16384, dl, "side-channel request");
      std::function<std::string(const std::string&)> handler;
      {
        std::lock_guard<std::mutex> g(mu_);
        handler = control_;
      }
      // The reply gets its own deadline: the request's was spent waiting for it and the dump.
      writeBlob(cfd, handler ? handler(request) : std::string("error side channel not ready"),
                monoNs() + kHandshakeNs, "side-channel reply");
      return false;
    }
    if (h.purpose != Purpose::kTransport) throw AuthError("unexpected handshake purpose");
    std::lock_guard<std::mutex> g(mu_);
    if (closedComms_.count(h.comm_id)) return false;  // closed since it was accepted: nobody takes it
    auto key = std::make_pair(h.comm_id, int(h.from_rank));
    auto it = parked_.find(key);
    if (it != parked_.end()) close(it->second);  // a retry replaces a stale attempt
    parked_[key] = cfd;
    cv_.notify_all();
    return true;
  } catch (const AuthError& e) {
    ++refused_;
    HETOBS_WARN("refused a connection from %s: %s", from.c_str(), e.what());
  } catch (const Error& e) {
    ++refused_;
    HETOBS_WARN("dropped a connection from %s during the handshake: %s", from.c_str(), e.what());
  }
  return false;
}

void Listener::setCredentials(Credentials cred) {
  std::lock_guard<std::mutex> g(mu_);
  cred_ = std::move(cred);
}

void Listener::markClosed(uint64_t commId) {
  std::lock_guard<std::mutex> g(mu_);
  closedComms_.insert(commId);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->first.first == commId) {
      close(it->second);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
}

void Listener::setControlHandler(std::function<std::string(const std::string&)> handler) {
  std::lock_guard<std::mutex> g(mu_);
  control_ = std::move(handler);
}

int Listener::take(uint64_t commId, int fromRank, int64_t deadlineNs) {
  std::unique_lock<std::mutex> lk(mu_);
  auto key = std::make_pair(commId, fromRank);
  for (;;) {
    auto it = parked_.find(key);
    if (it != parked_.end()) {
      int fd = it->second;
      parked_.erase(it);
      return fd;
    }
    int64_t left = deadlineNs - monoNs();
    if (left <= 0) return -1;
    cv_.wait_for(lk, std::chrono::nanoseconds(std::min<int64_t>(left, 1000000000)));  // left may be 'never'
  }
}

}  // namespace hetobs
