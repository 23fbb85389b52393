#pragma once
// Suspected hangs (docs/early-hangs.md): what the watchdog learns, per communicator, of how
// long this job's ops go without progress, and the quiet time beyond which an op in flight
// is a suspected hang.
//
// The history is the longest quiet time (no progress) the watchdog has seen in an op of the
// communicator that then completed: a running max, kept by the watchdog from its own looks
// (once per tick), so the op path pays nothing. Ops shorter than a tick are seen now and then;
// they matter only where HETOBS_SUSPECT_FACTOR times their length would pass the floor, and
// such ops span ticks, so they are seen. The first HETOBS_SUSPECT_HISTORY ops of a
// communicator are start-up (connections made, ranks still loading data) and teach nothing;
// it arms once as many again have been issued.
//
// Thread safety: none needed. One instance per communicator, used by the watchdog thread only.
#include <cstdint>
#include <limits>

namespace hetobs {

// HETOBS_SUSPECT_* (hetobs/settings_table.py): read once per process (common/env_config.cc).
struct SuspectSettings {
  double factor = 4;          // suspect past this many times the longest quiet seen
  double floor_s = 5;         // and never before this many seconds (inf: no early stage)
  uint64_t history_ops = 20;  // start-up ops that teach nothing, then as many before arming
};

class StallHistory {
 public:
  // The op this history last saw in flight, once it has left flight (completed or failed).
  struct Left {
    bool left = false;
    uint64_t record_id = 0;
    int64_t longest_quiet_ns = 0;  // the longest quiet time seen in it
    bool teaches = false;          // issued after start-up: its quiet time may be learned
  };

  // One look at the communicator: its oldest op in flight (`busy`; its record id, its index
  // among the ops issued on the communicator, counted from 1, and the time since its last
  // progress), or none. Says which op seen before has left flight since the last look.
  Left look(bool busy, uint64_t recordId, uint64_t opIndex, int64_t quietNs, const SuspectSettings& s);
  // Take a completed op's quiet time into the history (the caller checked it completed:
  // a failed op's wait says nothing of how long this job's ops take).
  void learn(int64_t quietNs);
  // The quiet time from which the op in flight (of index `opIndex`) is suspect: the floor or
  // factor x the longest quiet learned, whichever is longer; kOff while the communicator is
  // not armed or the early stage is off.
  int64_t thresholdNs(uint64_t opIndex, const SuspectSettings& s) const;
  int64_t longestNs() const { return longest_; }
  uint64_t learned() const { return learned_; }

  static constexpr int64_t kOff = std::numeric_limits<int64_t>::max();

 private:
  bool watching_ = false;
  uint64_t record_ = 0;
  int64_t maxQuiet_ = 0;
  bool teaches_ = false;
  int64_t longest_ = 0;
  uint64_t learned_ = 0;
};

}  // namespace hetobs
