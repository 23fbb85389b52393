#include "hetobs/bootstrap/handshake_pool.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <system_error>

#include "hetobs/common/log.h"

namespace hetobs {

void HandshakePool::reapLocked(std::list<Conn>* finished) {
  for (auto it = conns_.begin(); it != conns_.end();) {
    auto next = std::next(it);
    if (it->finished) finished->splice(finished->end(), conns_, it);
    it = next;
  }
}

void HandshakePool::run(int fd, Handler handler) {
  std::list<Conn> finished;
  std::unique_lock<std::mutex> lk(mu_);
  reapLocked(&finished);
  if (stopping_) {
    ::close(fd);
    return;
  }
  size_t pending = 0;
  Conn* oldest = nullptr;
  for (Conn& c : conns_)
    if (c.pending && !c.cutDone) {
      ++pending;
      if (!oldest || c.order < oldest->order) oldest = &c;
    }
  if (pending >= maxPending_ && oldest) {
    // Its read fails at once; its thread closes the fd (never us: it may be mid-call).
    shutdown(oldest->fd, SHUT_RDWR);
    oldest->cutDone = true;
    ++cut_;
  }
  conns_.emplace_back();
  Conn* conn = &conns_.back();
  conn->fd = fd;
  conn->order = ++order_;
  try {
    conn->thread = std::thread([this, conn, fd, handler = std::move(handler)] {
      sigset_t all;  // signals (stack dumps, the dump signal) stay with the application's threads
      sigfillset(&all);
      pthread_sigmask(SIG_BLOCK, &all, nullptr);
      bool keep = false;
      try {
        keep = handler(fd, [this, conn] {
          std::lock_guard<std::mutex> g(mu_);
          conn->pending = false;
        });
      } catch (const std::exception& e) {
        HETOBS_WARN("connection handler failed: %s", e.what());
      }
      {
        std::lock_guard<std::mutex> g(mu_);
        conn->pending = false;  // from here the pool never touches fd
        conn->finished = true;
      }
      if (!keep) ::close(fd);
    });
  } catch (const std::system_error& e) {
    conns_.pop_back();
    lk.unlock();
    HETOBS_WARN("no thread for an incoming connection (%s): dropped it", e.what());
    ::close(fd);
  }
  if (lk.owns_lock()) lk.unlock();
  for (Conn& c : finished) c.thread.join();
}

void HandshakePool::stop() {
  std::list<Conn> all;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    for (Conn& c : conns_)
      if (c.pending && !c.cutDone) {
        shutdown(c.fd, SHUT_RDWR);
        c.cutDone = true;
      }
    all.swap(conns_);
  }
  // The threads still refer to their Conn: it lives on in `all` until they are joined.
  for (Conn& c : all)
    if (c.thread.joinable()) c.thread.join();
}

}  // namespace hetobs
