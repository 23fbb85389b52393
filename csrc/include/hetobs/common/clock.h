#pragma once
// Clocks. Records use a monotonic ns clock for durations and keep one wall-clock
// anchor so dumps can print absolute times.
#include <cstdint>
#include <ctime>

namespace hetobs {

inline int64_t monoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

inline int64_t wallNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Wall time corresponding to a monotonic timestamp (anchored once per process).
int64_t monoToWallNs(int64_t mono);

}  // namespace hetobs
