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

  // ring() only when a waiter has announced itself. For producers whose every waiter sleeps
  // through waitUnless: the bell's line then stays put while both sides spin (two ring()s
  // per message were 14% of an 8 B all_reduce at 2 ranks, the line bouncing between cores).
  void ringIfWaiting();
  // wait(), unless news() (the waiter's own condition, re-read after it announced itself)
  // says there is something to do. Either the producer sees the announcement and rings, or
  // this sees the producer's publication: the seq_cst fences on both sides order them.
  template <class News>
  void waitUnless(uint32_t seen, int64_t timeoutNs, News news) {
    if (timeoutNs <= 0) return;
    waiters.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!news()) sleepWhile(seen, timeoutNs);
    waiters.fetch_sub(1, std::memory_order_seq_cst);
  }

 private:
  void sleepWhile(uint32_t seen, int64_t timeoutNs);  // the futex wait of an announced waiter
};

}  // namespace hetobs
