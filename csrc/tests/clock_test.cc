// monoNs() read through the TSC: across its re-anchoring (once a second) and from several
// threads at once, it never runs backwards in a thread and stays within microseconds of
// CLOCK_MONOTONIC; under ThreadSanitizer its seqlock shows no race.
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "hetobs/common/clock.h"
#include "native_test.h"

using hetobs::monoNs;
using hetobs::systemMonoNs;

NATIVE_TEST(clock_stays_monotonic_and_close_to_clock_monotonic) {
  constexpr int kThreads = 3;
  constexpr int64_t kRunNs = 2'500'000'000;  // spans two re-anchorings
  // Between the two system reads around it, give or take the read itself and a preemption.
  constexpr int64_t kToleranceNs = 100'000;
  std::atomic<int64_t> backwards{0}, worst{0}, reads{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&] {
      int64_t prev = monoNs(), end = systemMonoNs() + kRunNs, n = 0;
      for (;;) {
        int64_t a = systemMonoNs(), m = monoNs(), b = systemMonoNs();
        if (m < prev) backwards.fetch_add(1);
        prev = m;
        int64_t off = m < a ? a - m : (m > b ? m - b : 0);
        int64_t cur = worst.load();
        while (off > cur && !worst.compare_exchange_weak(cur, off)) {
        }
        ++n;
        if (b > end) break;
      }
      reads.fetch_add(n);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(backwards.load() == 0, std::to_string(backwards.load()) + " reads went backwards");
  CHECK(worst.load() <= kToleranceNs, "monoNs() was " + std::to_string(worst.load()) +
                                          " ns outside the CLOCK_MONOTONIC reads around it");
  CHECK(reads.load() > 1000, "only " + std::to_string(reads.load()) + " reads");
}
