#pragma once
// Folding one finished op into its op-kind stats (calls, bytes, latency and busbw
// histograms). `add(counter, n)` decides how counters are bumped: plainly under a
// communicator's seqlock, atomically where several threads finish ops.
#include <algorithm>
#include <cstdint>

#include "hetobs/stats/layout.h"

namespace hetobs {
namespace stats {

inline uint32_t log2Bucket(uint64_t v, uint32_t buckets) {
  return v ? std::min<uint32_t>(64 - uint32_t(__builtin_clzll(v)), buckets - 1) : 0;
}

template <class Add>
void noteOpEnd(OpKindStats& k, uint64_t bytes, int64_t durNs, bool ok, double busFactor, Add add) {
  uint64_t dur = uint64_t(durNs > 0 ? durNs : 0);
  add(k.calls, 1);
  add(k.bytes, bytes);
  add(k.total_ns, dur);
  if (!ok) add(k.errors, 1);
  add(k.latency[log2Bucket(dur / 1000, kLatencyBuckets)], 1);  // bucket b: < 2^b us
  if (ok && bytes && dur) {
    // bytes/ns == GB/s, so MB/s = bytes * 1000 / ns; bucket b: busbw < 2^b MB/s.
    auto mbps = uint64_t(double(bytes) * 1000.0 / double(dur) * busFactor);
    add(k.busbw[log2Bucket(mbps, kBandwidthBuckets)], 1);
  }
}

}  // namespace stats
}  // namespace hetobs
