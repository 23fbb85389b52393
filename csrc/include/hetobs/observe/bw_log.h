#pragma once
// BCCL-style bandwidth log (HETOBS_BW_LOG=verbose|agg). Driven by the watchdog thread,
// which tails the record ring: the op hot path pays nothing for it.
//   verbose: one line per finished op (op, bytes, time, algbw, busbw, comm, seq);
//   agg:     one line per (communicator, op) per interval: count, bytes, busbw mean/min/max.
// Lines go to HETOBS_BW_LOG_FILE (%h = host, %p = pid, %r = rank) or stderr.
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace hetobs {

enum class BwLogMode { kOff, kVerbose, kAgg };

class BwLog {
 public:
  BwLog(BwLogMode mode, double intervalS, const std::string& pathTemplate, int rank, const std::string& host);
  ~BwLog();
  // Called periodically (any cadence); writes what is due.
  void poll(int64_t nowMono);
  // At exit: log what is left, including a partial aggregation window.
  void finish(int64_t nowMono);
  bool enabled() const { return mode_ != BwLogMode::kOff; }

 private:
  struct Agg {
    uint64_t count = 0, bytes = 0;
    double sum = 0, min = 0, max = 0;
  };
  void line(const std::string& s);
  void flushAgg(int64_t nowMono);
  void drain(int64_t nowMono, bool final);

  std::mutex mu_;  // the watchdog and the exiting thread may both drain
  BwLogMode mode_;
  int64_t intervalNs_;
  int rank_;
  FILE* out_ = nullptr;
  bool ownFile_ = false;
  uint64_t nextRecord_ = 0;
  uint64_t skipped_ = 0;  // records overwritten before they were logged
  int64_t windowStart_ = 0;
  std::map<std::pair<uint64_t, uint8_t>, Agg> agg_;
};

BwLogMode parseBwLogMode(const std::string& s);  // throws Error naming the value

}  // namespace hetobs
