// A doorbell rung only for announced waiters (ringIfWaiting + waitUnless) never loses a
// wake-up: a consumer that sleeps for each of thousands of values, published at every
// moment relative to its announcement, is woken well before its 5 s timeout each time.
#include <atomic>
#include <chrono>
#include <thread>

#include "hetobs/common/asymmetric_fence.h"
#include "hetobs/common/futex.h"
#include "native_test.h"

namespace {

// light: the producer takes only a compiler barrier, the waiter a membarrier (the pair
// ShmChannel uses where asymmetricFencesAvailable()).
void ringIfWaitingLosesNoWakeUp(bool light) {
  constexpr uint64_t kValues = 5000;
  constexpr int64_t kTimeoutNs = 5000000000LL;
  hetobs::Doorbell bell;
  bell.heavy_waiter.store(light ? 1 : 0);
  std::atomic<uint64_t> published{0}, taken{0};
  std::thread producer([&] {
    for (uint64_t v = 1; v <= kValues; ++v) {
      while (taken.load(std::memory_order_acquire) != v - 1) std::this_thread::yield();
      // Vary the moment: before the consumer announces itself, around it, or after it sleeps.
      for (uint64_t spin = 0; spin < (v * 7919) % 3000; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);
      published.store(v, std::memory_order_release);
      bell.ringIfWaiting(light);
    }
  });
  auto slowest = std::chrono::nanoseconds(0);
  for (uint64_t v = 1; v <= kValues; ++v) {
    auto t0 = std::chrono::steady_clock::now();
    while (published.load(std::memory_order_acquire) < v) {
      uint32_t seen = bell.seq.load(std::memory_order_acquire);
      bell.waitUnless(seen, kTimeoutNs, [&] { return published.load(std::memory_order_acquire) >= v; });
    }
    slowest = std::max(slowest, std::chrono::steady_clock::now() - t0);
    taken.store(v, std::memory_order_release);
  }
  producer.join();
  CHECK(slowest < std::chrono::seconds(1),
        "a wait took " + std::to_string(slowest.count() / 1000000) + " ms: a wake-up was lost");
}

}  // namespace

NATIVE_TEST(doorbell_ring_if_waiting_loses_no_wake_up) { ringIfWaitingLosesNoWakeUp(false); }

NATIVE_TEST(doorbell_light_producer_heavy_waiter_loses_no_wake_up) {
  CHECK(hetobs::asymmetricFencesAvailable(), "membarrier(GLOBAL_EXPEDITED) unavailable: the light fence is never used here");
  ringIfWaitingLosesNoWakeUp(true);
}
