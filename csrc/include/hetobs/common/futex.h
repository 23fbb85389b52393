#pragma once
// A doorbell in shared memory: producers ring it after publishing, a waiter sleeps on
// it with a timeout. The waiter count lets producers skip the futex syscall when
// nobody sleeps, which is the common case on the fast path.
#include <atomic>
#include <cstdint>

#include "hetobs/common/asymmetric_fence.h"

namespace hetobs {

struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> waiters{0};
  // 1: this bell's waiter runs a heavy fence (common/asymmetric_fence.h) between announcing
  // itself and its re-check, so a producer registered for membarriers may look at `waiters`
  // after a compiler barrier only. Set by the owner before any peer maps the bell (an older
  // writer leaves it 0: full fences on both sides).
  std::atomic<uint32_t> heavy_waiter{0};

  void ring();
  // Sleep until seq != seen or timeoutNs elapses (spurious wake-ups allowed).
  void wait(uint32_t seen, int64_t timeoutNs);

  // ring() only when a waiter has announced itself. For producers whose every waiter sleeps
  // through waitUnless: the bell's line then stays put while both sides spin (two ring()s
  // per message were 14% of an 8 B all_reduce at 2 ranks, the line bouncing between cores).
  // lightFence: the producer may skip its full fence (asymmetricFencesAvailable() here and
  // heavy_waiter on the bell: ShmChannel decides it once per link).
  void ringIfWaiting(bool lightFence = false);
  // wait(), unless news() (the waiter's own condition, re-read after it announced itself)
  // says there is something to do. Either the producer sees the announcement and rings, or
  // this sees the producer's publication: full fences on both sides order them, or this
  // side's heavy fence with the producer's compiler barrier (heavy_waiter).
  template <class News>
  void waitUnless(uint32_t seen, int64_t timeoutNs, News news) {
    if (timeoutNs <= 0) return;
    waiters.fetch_add(1, std::memory_order_seq_cst);
    if (heavy_waiter.load(std::memory_order_relaxed)) heavyFence();
    else std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!news()) sleepWhile(seen, timeoutNs);
    waiters.fetch_sub(1, std::memory_order_seq_cst);
  }

 private:
  void sleepWhile(uint32_t seen, int64_t timeoutNs);  // the futex wait of an announced waiter
};

}  // namespace hetobs
