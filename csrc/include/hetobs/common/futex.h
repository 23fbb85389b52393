#pragma once
// A doorbell in shared memory: producers ring it after publishing, a waiter sleeps on
// it with a timeout. The waiter count lets producers skip the futex syscall when
// nobody sleeps, which is the common case on the fast path.
#include <atomic>
#include <cstdint>

namespace hetobs {

struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> waiters{0};

  void ring();
  // Sleep until seq != seen or timeoutNs elapses (spurious wake-ups allowed).
  void wait(uint32_t seen, int64_t timeoutNs);
};

}  // namespace hetobs
