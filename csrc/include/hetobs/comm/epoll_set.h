#pragma once
// The op thread's wait on its sockets: an epoll set holding, per peer slot, the channel's
// current interest (0: not in the set), with a syscall only when that interest changes, and
// whether the running op itself waits on that channel (else what arrives there is control
// traffic to drain: acks, aborts, EOF). No fd ceiling, unlike poll() over every link.
#include <sys/epoll.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hetobs {

class EpollSet {
 public:
  EpollSet() = default;
  ~EpollSet() { close(); }
  EpollSet(const EpollSet&) = delete;
  EpollSet& operator=(const EpollSet&) = delete;

  void open(size_t slots);  // throws Error when the kernel refuses a set
  void close();

  // Slot `p` now wants `events` on `fd` (0: out of the set, since epoll reports hang-ups even
  // for an empty mask). A replaced fd (a reconnect) is taken out and the new one added.
  void watch(size_t p, int fd, uint32_t events);
  void setWanted(size_t p, bool byOp) { wanted_[p] = byOp; }
  bool wanted(size_t p) const { return wanted_[p] != 0; }

  // Sleep until a watched fd is ready or `ns` passed (a plain sleep with no set). Returns
  // how many slots are ready, each named by readySlot(i).
  int wait(int64_t ns);
  size_t readySlot(int i) const { return events_[size_t(i)].data.u32; }

 private:
  int fd_ = -1;
  std::vector<uint32_t> mask_;
  std::vector<int> watchedFd_;
  std::vector<uint8_t> wanted_;
  std::vector<epoll_event> events_;
};

}  // namespace hetobs
