#pragma once
// Clocks. Records use a monotonic ns clock for durations and keep one wall-clock
// anchor so dumps can print absolute times.
#include <cstdint>
#include <ctime>
#include <limits>

namespace hetobs {

inline int64_t monoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// CLOCK_MONOTONIC as of the last kernel tick (resolution 1-4 ms; ~5 ns a read against ~18
// for monoNs here): for the per-frame "last moved" stamps that hang diagnosis reads in
// seconds, where two precise reads per message were 6% of an 8 B all_reduce. Never ahead
// of monoNs().
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
