#include "hetobs/common/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace hetobs {

void Doorbell::ring() {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void Doorbell::wait(uint32_t seen, int64_t timeoutNs) {
  waitUnless(seen, timeoutNs, [] { return false; });
}

void Doorbell::ringIfWaiting(bool lightFence) {
  // Our publication before the look at waiters: a full fence, or, where the waiter's heavy
  // fence stands in for it, only the compiler's.
  if (lightFence) std::atomic_signal_fence(std::memory_order_seq_cst);
  else std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_relaxed) != 0) ring();
}

void Doorbell::sleepWhile(uint32_t seen, int64_t timeoutNs) {
  timespec ts{time_t(timeoutNs / 1000000000LL), long(timeoutNs % 1000000000LL)};
  if (seq.load(std::memory_order_seq_cst) == seen)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

}  // namespace hetobs
