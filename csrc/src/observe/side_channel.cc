// Side channel: dump requests and liveness probes between ranks, peer to peer over
// each rank's authenticated listener, so they reach ranks on other hosts and work
// with any rank (rank 0 included) stopped or dead. Plus the per-rank Unix socket.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "hetobs/observe/dump_tree.h"

#include "hetobs/bootstrap/handshake.h"
#include "hetobs/bootstrap/handshake_pool.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"
#include "hetobs/common/log.h"
#include "hetobs/common/connect_retry.h"
#include "hetobs/common/net.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/observe/job_dir.h"

namespace hetobs {
namespace {
constexpr double kAskTimeoutS = 1.0;
constexpr size_t kMaxRequest = 16384;
constexpr int kUnixRequestMs = 2000;
}  // namespace

std::string sideChannelRequest(const std::string& ip, int port, const std::string& job, const std::string& secret,
                               const std::string& request, double timeoutS) {
  int64_t deadline = deadlineAfter(monoNs(), timeoutS);
  int fd = connectWithRetries(ConnectTarget{SockAddr{ip, port}, -1, "a side channel"}, deadline);
  try {
    Credentials cred{job, secret.empty() ? job : secret};
    Hello h;
    h.purpose = Purpose::kControl;
    clientHandshake(fd, cred, h, deadline);
    writeBlob(fd, request, deadline, "side-channel request");
    std::string reply = readBlob(fd, kMaxRequest, deadline, "side-channel reply");
    close(fd);
    return reply;
  } catch (...) {
    close(fd);
    throw;
  }
}

PeerAnswers Runtime::askPeers(const DumpRequest& req) {
  std::vector<Card> world;
  {
    std::lock_guard<std::mutex> g(mu_);
    world = world_;
  }
  PeerAnswers out;
  const int n = int(world.size());
  if (n <= 1 || req.origin < 0 || req.origin >= n) return out;
  // Coordinators that just left this rank's start request unanswered (spread_join.cc) are
  // not asked again: their chunks are taken over at once instead of after another timeout.
  // Ranks known gone are not asked either, but stay listed unanswered (that is what they are).
  auto in = [](const std::vector<int>& ranks) {
    return [&ranks](int rank) { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); };
  };
  auto isSilent = in(req.start_asks.unanswered);
  auto isGone = in(req.known_gone);
  SpreadOutcome o = spreadRequests(req.origin, n, req.interval, kSpreadFanout, [&](int rank, SpreadInterval chunk) {
    if (isSilent(rank) || isGone(rank)) return false;
    // "spread\n<incident>\n<reason>\n<from>\n<origin>\n<lo>\n<hi>\n<asked_ns>\n<cause>"
    std::string request = strFormat("spread\n%s\npeer_request\n%d\n%d\n%d\n%d\n%lld\n", req.incident.c_str(),
                                    cfg_.rank, req.origin, chunk.lo, chunk.hi, (long long)wallNs()) +
                          req.cause;
    const Card& c = world[size_t(rank)];
    try {
      std::string reply = sideChannelRequest(c.ip, c.port, cfg_.job, cfg_.secret, request, kAskTimeoutS);
      return reply.compare(0, 2, "ok") == 0;
    } catch (const std::exception& e) {
      HETOBS_DEBUG("incident %s: rank %d did not take the dump request: %s", req.incident.c_str(), rank, e.what());
      return false;
    }
  });
  o.asked.erase(std::remove_if(o.asked.begin(), o.asked.end(), isSilent), o.asked.end());
  o.unanswered.erase(std::remove_if(o.unanswered.begin(), o.unanswered.end(), isSilent), o.unanswered.end());
  out.asked = std::move(o.asked);
  out.answered = std::move(o.answered);
  out.unanswered = std::move(o.unanswered);
  return out;
}

void Runtime::startUnixSocket() {
  // Short path (sun_path holds 108 bytes): /tmp/hetobs-<uid>/<job hash>-r<rank>.sock
  std::string dir = "/tmp/hetobs-" + std::to_string(getuid());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    HETOBS_WARN("no per-rank control socket: cannot create %s: %s", dir.c_str(), errnoString(errno).c_str());
    return;
  }
  // Made by another user first, it could hold a socket of theirs in our name.
  if (std::string why = unsafeDirReason(dir, false); !why.empty()) {
    HETOBS_WARN("no per-rank control socket: directory %s %s (hetobs writes nothing there)", dir.c_str(), why.c_str());
    return;
  }
  Digest d = sha256(cfg_.job.data(), cfg_.job.size());
  std::string path = strFormat("%s/%02x%02x%02x%02x%02x%02x-r%d.sock", dir.c_str(), d[0], d[1], d[2], d[3], d[4], d[5],
                               cfg_.rank);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return;
  memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  // A predecessor with this job id and rank: its socket is stale once nobody listens on it.
  if (int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); probe >= 0) {
    bool live = connect(probe, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    close(probe);
    if (live) {
      HETOBS_WARN("no per-rank control socket: %s is a live process's (same job id and rank)", path.c_str());
      close(fd);
      return;
    }
  }
  unlink(path.c_str());
  mode_t old = umask(0177);  // the socket file is created 0600
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  umask(old);
  if (rc != 0 || listen(fd, 16) != 0) {
    HETOBS_WARN("no per-rank control socket at %s: %s", path.c_str(), errnoString(errno).c_str());
    close(fd);
    return;
  }
  chmod(path.c_str(), 0600);
  unixFd_ = fd;
  unixPath_ = path;
  unixPool_ = new HandshakePool();
  unixThread_ = std::thread([this] { unixLoop(); });
  unixThread_.detach();
}

void Runtime::unixLoop() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  for (;;) {
    int c = accept4(unixFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      return;
    }
    unixPool_->run(c, [this](int fd, const std::function<void()>& heard) {
      serveUnixClient(fd, heard);
      return false;
    });
  }
}

void Runtime::serveUnixClient(int c, const std::function<void()>& heard) {
  // One line: "dump" (optionally "dump <cause>"). Reply: "ok <incident>" once written.
  // A client gets kUnixRequestMs to send it; one that says nothing is dropped.
  pollfd p{c, POLLIN, 0};
  if (poll(&p, 1, kUnixRequestMs) <= 0) {
    HETOBS_DEBUG("control socket: a client sent no request within %d ms; dropped", kUnixRequestMs);
    return;
  }
  char buf[512];
  ssize_t n = recv(c, buf, sizeof buf - 1, MSG_DONTWAIT);
  heard();
  std::string line = n > 0 ? std::string(buf, size_t(n)) : "";
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  std::string reply;
  if (line.compare(0, 4, "dump") == 0) {
    DumpRequest req;
    req.incident = newIncidentId("ondemand");
    req.reason = "on_demand";
    req.cause = line.size() > 5 ? line.substr(5) : "requested on the control socket";
    std::string path = dump(req);
    reply = path.empty() ? "error dump failed\n" : "ok " + req.incident + " " + path + "\n";
  } else if (line == "ping") {
    reply = strFormat("pong %d %d\n", cfg_.rank, int(getpid()));
  } else {
    reply = "error unknown request (expected 'dump' or 'ping')\n";
  }
  // A small reply fits the socket buffer; a client that never reads cannot block us.
  ssize_t rc = send(c, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)rc;
}

}  // namespace hetobs
