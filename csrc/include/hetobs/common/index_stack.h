#pragma once
// A lock-free stack of the indices 0..N-1 of a fixed table: the free list of the table's
// slots. pop() and push() are one compare-and-swap each, with no lock and no allocation, so
// an application's thread can take and give back a slot per op. The top carries a tag that
// every change bumps: a pop that read the link of an index which meanwhile was popped,
// reused and pushed again fails its compare-and-swap instead of corrupting the list (ABA).
// Last in, first out: the slots in use (and whatever they hold, warm in cache) stay few.
#include <atomic>
#include <cstdint>

namespace hetobs {

template <uint32_t N>
class IndexStack {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  static_assert(N > 0 && N < kNone, "an index must fit below kNone");

  // Every index free, 0 on top.
  IndexStack() {
    for (uint32_t i = 0; i < N; ++i) next_[i].store(i + 1 < N ? i + 1 : kNone, std::memory_order_relaxed);
    top_.store(0, std::memory_order_relaxed);
  }

  // A free index, now the caller's; kNone when every index is taken.
  uint32_t pop() noexcept {
    uint64_t top = top_.load(std::memory_order_acquire);
    for (;;) {
      uint32_t i = uint32_t(top);
      if (i == kNone) return kNone;
      uint64_t next = bumped(top) | next_[i].load(std::memory_order_relaxed);
      if (top_.compare_exchange_weak(top, next, std::memory_order_acq_rel)) return i;
    }
  }

  // Give back index `i` (taken by pop()).
  void push(uint32_t i) noexcept {
    uint64_t top = top_.load(std::memory_order_relaxed);
    do {
      next_[i].store(uint32_t(top), std::memory_order_relaxed);
    } while (!top_.compare_exchange_weak(top, bumped(top) | i, std::memory_order_acq_rel));
  }

 private:
  static uint64_t bumped(uint64_t top) { return ((top >> 32) + 1) << 32; }

  std::atomic<uint64_t> top_;  // low 32 bits: the top index (kNone: empty); high 32 bits: the tag
  std::atomic<uint32_t> next_[N];
};

}  // namespace hetobs
