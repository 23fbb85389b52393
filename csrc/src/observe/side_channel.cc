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

#include "hetobs/bootstrap/handshake.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"
#include "hetobs/observe/runtime.h"

namespace hetobs {
namespace {
constexpr double kAskTimeoutS = 1.0;
constexpr size_t kAskBatch = 64;
constexpr size_t kMaxRequest = 16384;
}  // namespace

std::string sideChannelRequest(const std::string& ip, int port, const std::string& job, const std::string& secret,
                               const std::string& request, double timeoutS) {
  int64_t deadline = deadlineAfter(monoNs(), timeoutS);
  int fd = connectTcp(SockAddr{ip, port}, deadline);
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

PeerAnswers Runtime::askPeers(const std::string& incident, const std::string& reason, const std::string& cause) {
  std::vector<Card> world;
  {
    std::lock_guard<std::mutex> g(mu_);
    world = world_;
  }
  PeerAnswers out;
  std::string request = "dump\n" + incident + "\n" + reason + "\n" + std::to_string(cfg_.rank) + "\n" + cause;
  std::vector<const Card*> peers;
  for (const Card& c : world)
    if (c.rank != cfg_.rank) peers.push_back(&c);
  std::vector<char> ok(peers.size(), 0);
  for (size_t b = 0; b < peers.size(); b += kAskBatch) {
    std::vector<std::thread> threads;
    for (size_t i = b; i < std::min(peers.size(), b + kAskBatch); ++i) {
      threads.emplace_back([&, i] {
        try {
          std::string reply = sideChannelRequest(peers[i]->ip, peers[i]->port, cfg_.job, cfg_.secret, request,
                                                 kAskTimeoutS);
          ok[i] = reply.compare(0, 2, "ok") == 0;
        } catch (const std::exception&) {
          ok[i] = 0;
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    out.asked.push_back(peers[i]->rank);
    (ok[i] ? out.answered : out.unanswered).push_back(peers[i]->rank);
  }
  return out;
}

void Runtime::startUnixSocket() {
  // Short path (sun_path holds 108 bytes): /tmp/hetobs-<uid>/<job hash>-r<rank>.sock
  std::string dir = "/tmp/hetobs-" + std::to_string(getuid());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    HETOBS_WARN("no per-rank control socket: cannot create %s: %s", dir.c_str(), errnoString(errno).c_str());
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
    // One line: "dump" (optionally "dump <cause>"). Reply: "ok <incident>" once written.
    char buf[512];
    ssize_t n = recv(c, buf, sizeof buf - 1, 0);
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
    ssize_t rc = send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
    (void)rc;
    close(c);
  }
}

}  // namespace hetobs
