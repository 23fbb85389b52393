#include "hetobs/bootstrap/rendezvous.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "hetobs/bootstrap/card.h"
#include "hetobs/bootstrap/handshake_pool.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/connect_retry.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"

namespace hetobs {
namespace {

constexpr size_t kMaxCard = 4096;
constexpr size_t kMaxJobId = 256;
constexpr int64_t kPerClientNs = 2000000000LL;
const std::string kErrorPrefix = "hetobs-rendezvous-error:";
constexpr int64_t kTableGraceNs = 3000000000LL;

std::string packTable(const std::vector<std::string>& cards) {
  std::string out;
  for (const auto& c : cards) {
    uint32_t n = uint32_t(c.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += c;
  }
  return out;
}

std::vector<std::string> unpackTable(const std::string& blob, int size) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos + 4 <= blob.size() && int(out.size()) < size) {
    uint32_t n;
    memcpy(&n, blob.data() + pos, 4);
    pos += 4;
    if (pos + n > blob.size()) break;
    out.emplace_back(blob.substr(pos, n));
    pos += n;
  }
  if (int(out.size()) != size) throw Error("rendezvous table is truncated");
  return out;
}

// What the host's connection threads fill in, one rank at a time.
struct Arrivals {
  std::mutex mu;
  std::vector<std::string> cards;
  std::vector<int> fds;
  int missing = 0;
  int wake[2] = {-1, -1};  // a byte per arrival wakes the accept loop
};

// One client's handshake and card, on its own thread (HandshakePool): true if it joined.
bool admit(Arrivals& a, int cfd, int size, const Credentials& cred, const std::string& jobId, int64_t deadlineNs,
           const std::function<void()>& authenticated) {
  std::string from = peerAddressOf(cfd);
  try {
    int64_t dl = std::min(deadlineNs, monoNs() + kPerClientNs);
    auto wanted = [size](const Hello& x) {
      return x.purpose == Purpose::kRendezvous && x.from_rank > 0 && x.from_rank < size;
    };
    // Proven before the accept goes out: the pool must not cut a rank that is already on its way.
    Hello h = serverHandshake(cfd, cred, dl, [&](const Hello& x) {
      if (wanted(x)) authenticated();
      return kHandshakeAccepted;
    });
    if (!wanted(h)) throw AuthError(strFormat("bad rendezvous request (rank %d of %d)", h.from_rank, size));
    writeBlob(cfd, jobId, dl, "rendezvous job id");
    std::string card = readBlob(cfd, kMaxCard, dl, "rendezvous card");
    Card::decode(card);
    int r = h.from_rank;
    {
      std::lock_guard<std::mutex> g(a.mu);
      if (a.fds[size_t(r)] >= 0) {
        HETOBS_WARN("rendezvous: rank %d connected twice (from %s); keeping the newer connection", r, from.c_str());
        close(a.fds[size_t(r)]);
        ++a.missing;
      }
      a.fds[size_t(r)] = cfd;
      a.cards[size_t(r)] = card;
      --a.missing;
    }
    char c = 1;
    ssize_t rc = write(a.wake[1], &c, 1);
    (void)rc;
    return true;
  } catch (const AuthError& e) {
    HETOBS_WARN("rendezvous refused a connection from %s: %s", from.c_str(), e.what());
  } catch (const Error& e) {
    HETOBS_WARN("rendezvous dropped a connection from %s: %s", from.c_str(), e.what());
  }
  return false;
}

std::vector<std::string> host(int size, const SockAddr& master, const Credentials& cred, const std::string& jobId,
                              const std::string& myCard, int64_t deadlineNs) {
  SockAddr bound;
  int lfd = listenTcp(rendezvousListenAddress(master.host), master.port, &bound, std::max(1024, size + 128));
  Arrivals a;
  a.cards.assign(static_cast<size_t>(size), std::string());
  a.fds.assign(static_cast<size_t>(size), -1);
  a.cards[0] = myCard;
  a.missing = size - 1;
  if (pipe2(a.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(lfd);
    throw Error("rendezvous: pipe2: " + errnoString(errno));
  }
  auto closeAll = [&] {
    for (int fd : a.fds)
      if (fd >= 0) close(fd);
    close(lfd);
    close(a.wake[0]);
    close(a.wake[1]);
  };
  HandshakePool pool(pendingBudget(size_t(size - 1)));  // every rank dials at once
  try {
    for (;;) {
      {
        std::lock_guard<std::mutex> g(a.mu);
        if (a.missing <= 0) break;
      }
      int64_t left = deadlineNs - monoNs();
      if (left <= 0) {
        pool.stop();  // no connection thread touches the arrivals after this
        std::string who;
        int count = 0;
        for (int r = 1; r < size; ++r)
          if (a.fds[size_t(r)] < 0) {
            who += (who.empty() ? "" : ", ") + std::to_string(r);
            ++count;
          }
        std::string msg = strFormat("rendezvous on port %d timed out: %s %s never arrived (check MASTER_ADDR, "
                                    "MASTER_PORT and WORLD_SIZE on %s)",
                                    master.port, count > 1 ? "ranks" : "rank", who.c_str(),
                                    count > 1 ? "those ranks" : "that rank");
        // Tell the ranks that did arrive why, so every rank names the missing one.
        for (int r = 1; r < size; ++r)
          if (a.fds[size_t(r)] >= 0) {
            try {
              writeBlob(a.fds[size_t(r)], kErrorPrefix + msg, monoNs() + 500000000LL, "rendezvous error");
            } catch (const Error&) {
            }
          }
        throw Error(msg);
      }
      pollfd p[2] = {{lfd, POLLIN, 0}, {a.wake[0], POLLIN, 0}};
      int rc = poll(p, 2, int(std::min<int64_t>(left / 1000000 + 1, 1000)));
      if (rc <= 0) continue;
      if (p[1].revents) {
        char buf[64];
        while (read(a.wake[0], buf, sizeof buf) > 0) {
        }
      }
      if (!(p[0].revents & POLLIN)) continue;
      int cfd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (cfd < 0) continue;
      pool.run(cfd, [&a, size, &cred, &jobId, deadlineNs](int fd, const std::function<void()>& authenticated) {
        return admit(a, fd, size, cred, jobId, deadlineNs, authenticated);
      });
    }
    pool.stop();  // strangers still talking are cut; every rank's connection is in a.fds
    std::string table = packTable(a.cards);
    for (int r = 1; r < size; ++r) writeBlob(a.fds[size_t(r)], table, deadlineNs, "rendezvous table");
  } catch (...) {
    pool.stop();
    closeAll();
    throw;
  }
  closeAll();
  return a.cards;
}

}  // namespace

std::vector<std::string> rendezvous(int rank, int size, const SockAddr& master, const Credentials& cred,
                                    const std::string& jobId,
                                    const std::function<void(const std::string&)>& onJobId,
                                    const std::string& myCard, int64_t deadlineNs) {
  if (size == 1) return {myCard};
  if (rank == 0) return host(size, master, cred, jobId, myCard, deadlineNs);
  std::string fatal;  // rank 0 gave up and said why: do not retry
  for (;;) {
    // Retries (back-off, HETOBS_CONNECT_RETRIES) happen inside: rank 0 may start late.
    int fd = connectWithRetries(ConnectTarget{master, 0, "rank 0's rendezvous"}, deadlineNs);
    try {
      Hello h;
      h.purpose = Purpose::kRendezvous;
      h.from_rank = rank;
      h.to_rank = 0;
      clientHandshake(fd, cred, h, deadlineNs);
      std::string id = readBlob(fd, kMaxJobId, deadlineNs, "rendezvous job id");
      try {
        onJobId(id);
      } catch (const Error& e) {
        fatal = e.what();
        throw;
      }
      writeBlob(fd, myCard, deadlineNs, "rendezvous card");
      // Wait a little past our own deadline: rank 0 started its clock later and, if a rank
      // never arrives, sends the reason (naming that rank) when its own deadline passes.
      std::string table;
      try {
        int64_t until = deadlineNs >= kNeverNs - kTableGraceNs ? kNeverNs : deadlineNs + kTableGraceNs;
        table = readBlob(fd, kMaxCard * size_t(size) + 4 * size_t(size), until,
                         "rendezvous table");
      } catch (const Error&) {
        fatal = strFormat("rendezvous: rank 0 at %s sent no rank table within the connect timeout; some rank never "
                          "arrived (rank 0's log names it; check MASTER_ADDR, MASTER_PORT and WORLD_SIZE everywhere)",
                          master.str().c_str());
        throw Error(fatal);
      }
      close(fd);
      if (table.compare(0, kErrorPrefix.size(), kErrorPrefix) == 0) {
        fatal = table.substr(kErrorPrefix.size());
        throw Error(fatal);
      }
      return unpackTable(table, size);
    } catch (const AuthError&) {
      close(fd);
      throw;
    } catch (const Error& e) {
      close(fd);
      if (!fatal.empty()) throw Error(fatal);
      if (monoNs() >= deadlineNs)
        throw Error(strFormat("rendezvous with rank 0 at %s failed: %s", master.str().c_str(), e.what()));
      // Rank 0 may have restarted its listener (stale port from an earlier job): retry.
      usleep(50000);
    }
  }
}

}  // namespace hetobs
