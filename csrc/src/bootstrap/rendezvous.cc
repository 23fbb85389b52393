#include "hetobs/bootstrap/rendezvous.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hetobs/bootstrap/card.h"
#include "hetobs/common/clock.h"
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

std::vector<std::string> host(int size, const SockAddr& master, const Credentials& cred, const std::string& jobId,
                              const std::string& myCard, int64_t deadlineNs) {
  SockAddr bound;
  int lfd = listenTcp("0.0.0.0", master.port, &bound, 1024);
  std::vector<std::string> cards(static_cast<size_t>(size));
  std::vector<int> fds(static_cast<size_t>(size), -1);
  cards[0] = myCard;
  int missing = size - 1;
  try {
    while (missing > 0) {
      int64_t left = deadlineNs - monoNs();
      if (left <= 0) {
        std::string who;
        int count = 0;
        for (int r = 1; r < size; ++r)
          if (fds[size_t(r)] < 0) {
            who += (who.empty() ? "" : ", ") + std::to_string(r);
            ++count;
          }
        std::string msg = strFormat("rendezvous on port %d timed out: %s %s never arrived (check MASTER_ADDR, "
                                    "MASTER_PORT and WORLD_SIZE on %s)",
                                    master.port, count > 1 ? "ranks" : "rank", who.c_str(),
                                    count > 1 ? "those ranks" : "that rank");
        // Tell the ranks that did arrive why, so every rank names the missing one.
        for (int r = 1; r < size; ++r)
          if (fds[size_t(r)] >= 0) {
            try {
              writeBlob(fds[size_t(r)], kErrorPrefix + msg, monoNs() + 500000000LL, "rendezvous error");
            } catch (const Error&) {
            }
          }
        throw Error(msg);
      }
      pollfd p{lfd, POLLIN, 0};
      int rc = poll(&p, 1, int(std::min<int64_t>(left / 1000000 + 1, 1000)));
      if (rc <= 0) continue;
      int cfd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (cfd < 0) continue;
      std::string from = peerAddressOf(cfd);
      try {
        int64_t dl = std::min(deadlineNs, monoNs() + kPerClientNs);
        Hello h = serverHandshake(cfd, cred, dl);
        if (h.purpose != Purpose::kRendezvous || h.from_rank <= 0 || h.from_rank >= size)
          throw AuthError(strFormat("bad rendezvous request (rank %d of %d)", h.from_rank, size));
        writeBlob(cfd, jobId, dl, "rendezvous job id");
        std::string card = readBlob(cfd, kMaxCard, dl, "rendezvous card");
        Card::decode(card);
        int r = h.from_rank;
        if (fds[size_t(r)] >= 0) {
          HETOBS_WARN("rendezvous: rank %d connected twice (from %s); keeping the newer connection", r, from.c_str());
          close(fds[size_t(r)]);
          ++missing;
        }
        fds[size_t(r)] = cfd;
        cards[size_t(r)] = card;
        --missing;
      } catch (const AuthError& e) {
        HETOBS_WARN("rendezvous refused a connection from %s: %s", from.c_str(), e.what());
        close(cfd);
      } catch (const Error& e) {
        HETOBS_WARN("rendezvous dropped a connection from %s: %s", from.c_str(), e.what());
        close(cfd);
      }
    }
    std::string table = packTable(cards);
    for (int r = 1; r < size; ++r) writeBlob(fds[size_t(r)], table, deadlineNs, "rendezvous table");
  } catch (...) {
    for (int fd : fds)
      if (fd >= 0) close(fd);
    close(lfd);
    throw;
  }
  for (int fd : fds)
    if (fd >= 0) close(fd);
  close(lfd);
  return cards;
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
    int fd = connectTcp(master, deadlineNs);
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
