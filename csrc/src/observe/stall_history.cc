#include "hetobs/observe/stall_history.h"

#include <algorithm>

#include "hetobs/common/clock.h"

namespace hetobs {

StallHistory::Left StallHistory::look(bool busy, uint64_t recordId, uint64_t opIndex, int64_t quietNs,
                                      const SuspectSettings& s) {
  Left out;
  if (watching_ && (!busy || recordId != record_)) {
    out.left = true;
    out.record_id = record_;
    out.longest_quiet_ns = maxQuiet_;
    out.teaches = teaches_;
    watching_ = false;
  }
  if (busy) {
    if (!watching_) {
      watching_ = true;
      record_ = recordId;
      maxQuiet_ = 0;
      teaches_ = opIndex > s.history_ops;
    }
    maxQuiet_ = std::max(maxQuiet_, quietNs);
  }
  return out;
}

void StallHistory::learn(int64_t quietNs) {
  longest_ = std::max(longest_, quietNs);
  ++learned_;
}

int64_t StallHistory::thresholdNs(uint64_t opIndex, const SuspectSettings& s) const {
  if (opIndex <= 2 * s.history_ops) return kOff;
  int64_t floor = secondsToNs(s.floor_s);
  if (floor == kNeverNs) return kOff;
  double scaled = s.factor * double(longest_);
  int64_t learnedNs = scaled >= 9.2e18 ? kNeverNs : int64_t(scaled);
  return std::max(floor, learnedNs);
}

}  // namespace hetobs
