#pragma once
// The rank's one listening socket. A background thread accepts; each connection is
// authenticated on a thread of its own (HandshakePool: a stranger is refused and logged,
// and one that stays silent delays nobody else); good connections are parked until the
// communicator that expects them takes them.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <string>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "hetobs/bootstrap/handshake.h"
#include "hetobs/bootstrap/handshake_pool.h"
#include "hetobs/common/net.h"

namespace hetobs {

class Listener {
 public:
  // `peers`: how many other ranks may dial it at once (the world size less one): the accept
  // backlog and the budget of unproven handshakes are sized to it.
  Listener(Credentials cred, const std::string& bindHost, size_t peers = 0);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int port() const { return addr_.port; }
  const std::string& host() const { return addr_.host; }  // the bound address (0.0.0.0: every interface)
  // Wait for the authenticated connection from `fromRank` of communicator `commId`.
  int take(uint64_t commId, int fromRank, int64_t deadlineNs);
  uint64_t refused() const { return refused_; }
  // The key handshakes are checked against from now on (once: when the job id is agreed,
  // before this rank's card is handed out, so no peer can have dialled with the new key yet).
  void setCredentials(Credentials cred);
  // Side-channel requests (Purpose::kControl) are answered by this function.
  void setControlHandler(std::function<std::string(const std::string&)> handler);
  // Communicator `commId` is closed (or failed) here: redials and reconnect probes for it are
  // answered "closed" (a deliberate close, said explicitly), and its parked connections dropped.
  void markClosed(uint64_t commId);
  uint64_t cut() const { return pool_.cut(); }  // unproven connections cut past the budget

 private:
  void loop();
  bool handle(int fd, const std::function<void()>& authenticated);  // true: parked (kept)

  Credentials cred_;  // guarded by mu_
  SockAddr addr_;
  int fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<uint64_t, int>, int> parked_;
  std::set<uint64_t> closedComms_;  // guarded by mu_; a few ids per communicator ever made
  std::atomic<uint64_t> refused_{0};
  std::function<std::string(const std::string&)> control_;
  HandshakePool pool_;
};

}  // namespace hetobs
