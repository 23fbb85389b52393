#include "hetobs/comm/epoll_set.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

#include "hetobs/common/error.h"

namespace hetobs {

void EpollSet::open(size_t slots) {
  mask_.assign(slots, 0);
  wanted_.assign(slots, 0);
  watchedFd_.assign(slots, -1);
  events_.assign(std::max<size_t>(1, std::min<size_t>(slots, 1024)), epoll_event{});
  fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (fd_ < 0) throw Error("epoll_create1: " + errnoString(errno));
}

void EpollSet::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void EpollSet::watch(size_t p, int fd, uint32_t events) {
  uint32_t& now = mask_[p];
  if (fd != watchedFd_[p] && now != 0) {  // the channel's socket was replaced (a reconnect)
    epoll_ctl(fd_, EPOLL_CTL_DEL, watchedFd_[p], nullptr);  // gone already if it was closed
    now = 0;
  }
  if (events == now || fd_ < 0) return;
  if (events == 0) {
    epoll_ctl(fd_, EPOLL_CTL_DEL, fd, nullptr);  // fails only if it is out of the set already
    now = 0;
    return;
  }
  epoll_event e{};
  e.events = events;
  e.data.u32 = uint32_t(p);
  if (epoll_ctl(fd_, now == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &e) == 0) {
    now = events;
    watchedFd_[p] = fd;
  }
}

int EpollSet::wait(int64_t ns) {
  // ppoll on the epoll fd: sub-millisecond bounds (the relay wakes every 100 us to hand on
  // finished copies), then the ready slots without waiting.
  timespec ts{time_t(ns / 1000000000LL), long(ns % 1000000000LL)};
  pollfd ep{fd_, POLLIN, 0};
  int rc = fd_ >= 0 ? ppoll(&ep, 1, &ts, nullptr) : ppoll(nullptr, 0, &ts, nullptr);
  if (rc <= 0) return 0;
  int got = epoll_wait(fd_, events_.data(), int(events_.size()), 0);
  return got > 0 ? got : 0;
}

}  // namespace hetobs
