#pragma once
// Clocks. Records use a monotonic ns clock for durations and keep one wall-clock
// anchor so dumps can print absolute times.
#include <atomic>
#include <cstdint>
#include <ctime>
#include <limits>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace hetobs {

// CLOCK_MONOTONIC from the kernel (vDSO): ~16 ns a read here.
inline int64_t systemMonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

namespace clock_detail {
// monoNs() as a linear function of the CPU's time-stamp counter, ns = ns0 + (tsc - tsc0) x
// mult / 2^32, valid for `span` ticks after tsc0; published under the seqlock `seq` (odd
// while written) by monoNsSlow(), which re-anchors it to CLOCK_MONOTONIC about once a
// second. span 0: not calibrated yet, or the TSC is not usable here (every read is slow).
struct TscClock {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint64_t> tsc0{0};
  std::atomic<int64_t> ns0{0};
  std::atomic<uint64_t> mult{0};
  std::atomic<uint64_t> span{0};
};
extern TscClock gTsc;
int64_t monoNsSlow();

#if defined(__x86_64__)
// The counter now and the parameters, read once; `consistent()` says whether no anchoring
// changed them meanwhile (then `value()` is the clock's reading).
struct TscRead {
  uint32_t seq;
  uint64_t t, t0, mult, span;
  int64_t n0;
  bool consistent() const { return !(seq & 1) && gTsc.seq.load(std::memory_order_relaxed) == seq; }
  int64_t value() const { return n0 + int64_t((unsigned __int128)(t - t0) * mult >> 32); }
};

inline TscRead readTsc() {
  TscRead r;
  r.seq = gTsc.seq.load(std::memory_order_acquire);
  r.t = __rdtsc();
  r.t0 = gTsc.tsc0.load(std::memory_order_relaxed);
  r.mult = gTsc.mult.load(std::memory_order_relaxed);
  r.span = gTsc.span.load(std::memory_order_relaxed);
  r.n0 = gTsc.ns0.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  return r;
}
#endif
}  // namespace clock_detail

// The process's monotonic clock, in ns: CLOCK_MONOTONIC read through the TSC where the
// kernel itself keeps time with an invariant TSC (one rdtsc, ~8 ns here, against ~16 for
// clock_gettime: ops read it twice, and it was a fifth of an 8 B all_reduce's time), else
// clock_gettime. It stays within a few microseconds of CLOCK_MONOTONIC (re-anchored every
// second, errors slewed out, never stepped back), so times from time.monotonic_ns() mix in.
inline int64_t monoNs() {
#if defined(__x86_64__)
  // Not calibrated, or no usable TSC here (kvm-clock, hpet): clock_gettime, no rdtsc first.
  if (__builtin_expect(clock_detail::gTsc.span.load(std::memory_order_relaxed) == 0, 0))
    return clock_detail::monoNsSlow();
  clock_detail::TscRead r = clock_detail::readTsc();
  // A counter behind t0 wraps to a huge distance: the slow path, as past the span.
  if (__builtin_expect(r.t - r.t0 < r.span && r.consistent(), 1)) return r.value();
  return clock_detail::monoNsSlow();
#else
  return systemMonoNs();
#endif
}

// CLOCK_MONOTONIC as of the last kernel tick (resolution 1-4 ms; ~4 ns a read against ~16 for
// clock_gettime here): for the per-frame "last moved" stamps that hang diagnosis reads in
// seconds, where two precise reads per message were 6% of an 8 B all_reduce. Behind
// monoNs() by up to a tick (give or take monoNs()'s microseconds).
inline int64_t monoCoarseNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

inline int64_t wallNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// A deadline that never comes: what an infinite timeout turns into.
constexpr int64_t kNeverNs = std::numeric_limits<int64_t>::max();

// Seconds (a validated timeout: >= 0, possibly inf) as ns, saturating at kNeverNs, so
// inf or an absurdly long timeout means "never" instead of overflowing to INT64_MIN.
inline int64_t secondsToNs(double s) {
  if (!(s < 9.2e9)) return kNeverNs;  // also catches inf (NaN is refused by the parsers)
  return s <= 0 ? 0 : int64_t(s * 1e9);
}

// now + timeout, saturating: the deadline for a wait of `s` seconds starting at `now`.
inline int64_t deadlineAfter(int64_t now, double s) {
  int64_t d = secondsToNs(s);
  return d >= kNeverNs - now ? kNeverNs : now + d;
}

// Wall time corresponding to a monotonic timestamp (anchored once per process).
int64_t monoToWallNs(int64_t mono);

}  // namespace hetobs
