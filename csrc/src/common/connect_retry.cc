#include "hetobs/common/connect_retry.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <random>
#include <set>

#include "hetobs/common/clock.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/log.h"

namespace hetobs {
namespace {

constexpr int64_t kFirstBackoffNs = 10000000LL;  // 10 ms: a peer a moment late costs little
constexpr int64_t kMaxBackoffNs = 1000000000LL;  // 1 s: a peer minutes late is not hammered
// While refusals are being timed (RetryLimits::refused_for_ns), dials stay this close
// together: "refused for 1.5 s" must mean refused at every dial of those 1.5 s, so a fault
// that ends inside the window is seen over within this long, not at a back-off dial
// that may only come at the window's end.
constexpr int64_t kRefusedProbeNs = 50000000LL;

// One attempt waits this long at most for the peer's answer, then the next attempt sends a
// fresh SYN from a fresh port. A SYN or SYN-ACK lost to a network fault is otherwise re-sent
// by the kernel only after 1, 3, 7, 15 s, and a reconnect dialled during a burst of resets
// once sat in one attempt for its whole 30 s deadline after the network was back.
constexpr int64_t kAttemptNs = 1000000000LL;

// One connect attempt; returns the fd or -errno.
int attemptConnect(const sockaddr_in& sa, int64_t deadlineNs) {
  deadlineNs = std::min(deadlineNs, monoNs() + kAttemptNs);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw Error("socket: " + errnoString(errno));
  int rc = connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
  int err = rc == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    err = ETIMEDOUT;
    for (;;) {
      int64_t left = deadlineNs - monoNs();
      if (left <= 0) break;
      pollfd p{fd, POLLOUT, 0};
      int prc = poll(&p, 1, int(std::min<int64_t>(left / 1000000 + 1, 1000)));
      if (prc < 0 && errno == EINTR) continue;
      if (prc <= 0) continue;
      socklen_t l = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
      break;
    }
  }
  if (err == 0) return fd;
  close(fd);
  return -err;
}

sockaddr_in resolveOrThrow(const ConnectTarget& t) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(t.addr.port));
  if (inet_pton(AF_INET, t.addr.host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(t.addr.host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) throw Error("cannot resolve host '" + t.addr.host + "': " + gai_strerror(rc));
  sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return sa;
}

// Once per peer address and process: a job whose rank 0 starts late logs one line per
// rank, not one per attempt.
void noteRetrying(const ConnectTarget& t, int err, int maxAttempts) {
  static std::mutex mu;
  static std::set<std::string> told;
  std::string key = t.addr.str() + "|" + t.what;
  {
    std::lock_guard<std::mutex> g(mu);
    if (!told.insert(key).second) return;
  }
  HETOBS_INFO("connecting to %s at %s: %s; retrying (at most %d attempts, within HETOBS_CONNECT_TIMEOUT)",
              t.what.empty() ? "a peer" : t.what.c_str(), t.addr.str().c_str(), errnoString(err).c_str(),
              maxAttempts);
}

}  // namespace

int64_t retryBackoffNs(int attempt) {
  int64_t base = kFirstBackoffNs;
  for (int i = 2; i < attempt && base < kMaxBackoffNs; ++i) base *= 2;
  base = std::min(base, kMaxBackoffNs);
  thread_local std::minstd_rand rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> jitter(-base / 4, base / 4);
  return base + jitter(rng);
}

int connectWithRetries(const ConnectTarget& t, int64_t deadlineNs, RetryLimits limits) {
  const int maxAttempts = limits.attempts > 0 ? limits.attempts : netSettings().connect_retries;
  const sockaddr_in sa = resolveOrThrow(t);
  int64_t refusedSince = -1;
  int err = 0;
  int attempt = 0;
  while (attempt < maxAttempts) {
    ++attempt;
    int fd = attemptConnect(sa, deadlineNs);
    if (fd >= 0) {
      setNonBlocking(fd, false);
      setNoDelay(fd);
      return fd;
    }
    err = -fd;
    int64_t now = monoNs();
    if (err == ECONNREFUSED) {
      if (refusedSince < 0) refusedSince = now;
      if (limits.refused_for_ns >= 0 && now - refusedSince >= limits.refused_for_ns) break;
    } else {
      refusedSince = -1;
    }
    if (attempt >= maxAttempts) break;
    int64_t wait = retryBackoffNs(attempt + 1);
    if (limits.refused_for_ns >= 0 && refusedSince >= 0)
      wait = std::min({wait, kRefusedProbeNs, std::max<int64_t>(0, refusedSince + limits.refused_for_ns - now)});
    if (now + wait >= deadlineNs) break;
    noteRetrying(t, err, maxAttempts);
    usleep(useconds_t(std::max<int64_t>(wait, 1000) / 1000));
  }
  std::string who = t.what.empty() ? t.addr.str() : t.what + " at " + t.addr.str();
  const char* why = attempt >= maxAttempts ? "HETOBS_CONNECT_RETRIES" : "the connect deadline";
  if (limits.refused_for_ns >= 0 && err == ECONNREFUSED && refusedSince >= 0 &&
      monoNs() - refusedSince >= limits.refused_for_ns)
    why = "refused throughout: nothing listens there";
  ConnectError e(strFormat("cannot connect to %s: %s after %d attempt%s (gave up: %s)", who.c_str(),
                           errnoString(err).c_str(), attempt, attempt == 1 ? "" : "s", why),
                 t.peer, t.addr.str(), attempt, err);
  if (err == ECONNREFUSED && refusedSince >= 0) e.refused_ns = monoNs() - refusedSince;
  throw e;
}

}  // namespace hetobs
