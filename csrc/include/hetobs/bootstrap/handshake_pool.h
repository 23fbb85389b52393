#pragma once
// Runs the handshake of each accepted connection (and whatever that connection then asks
// for) on a thread of its own, so a connection that says nothing holds up only itself:
// every handshake keeps its own deadline and legitimate peers never queue behind a silent
// stranger. At most `maxPending` connections may be unauthenticated at once; past that the
// oldest one is cut (its peer has had the longest to speak). A connection that proved the key
// is never cut. The owner sizes the budget to the job (pendingBudget): at start-up every
// same-host peer of a rank dials it at once, and those must fit beside the strangers.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

namespace hetobs {

constexpr size_t kMaxPendingHandshakes = 64;

// Unproven connections a server of a job of `peers` other ranks lets wait at once: room for all
// of them dialling together (a rank's listener at start-up, rank 0's rendezvous) plus the
// stranger allowance. A stranger holds a thread for one handshake deadline (2 s) either way.
inline size_t pendingBudget(size_t peers) { return kMaxPendingHandshakes + peers; }

class HandshakePool {
 public:
  // Called on the connection's thread. It calls authenticated() once the peer has proved
  // itself (the pool never cuts it after that) and returns true to keep the fd (it now owns
  // it), false to have the pool close it.
  using Handler = std::function<bool(int fd, const std::function<void()>& authenticated)>;

  explicit HandshakePool(size_t maxPending = kMaxPendingHandshakes) : maxPending_(maxPending) {}
  ~HandshakePool() { stop(); }
  HandshakePool(const HandshakePool&) = delete;
  HandshakePool& operator=(const HandshakePool&) = delete;

  // Hand over an accepted connection (the pool owns fd from here on).
  void run(int fd, Handler handler);
  // Cut the connections still in their handshake and wait for every thread to finish.
  void stop();
  uint64_t cut() const { return cut_; }  // cut past the cap, for logs and tests

 private:
  struct Conn {
    int fd;
    uint64_t order;
    bool pending = true;  // not yet authenticated: may be cut
    bool cutDone = false;
    bool finished = false;
    std::thread thread;
  };
  void reapLocked(std::list<Conn>* finished);

  const size_t maxPending_;
  std::mutex mu_;
  std::list<Conn> conns_;
  uint64_t order_ = 0;
  uint64_t cut_ = 0;
  bool stopping_ = false;
};

}  // namespace hetobs
