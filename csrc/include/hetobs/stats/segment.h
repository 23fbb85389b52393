#pragma once
// Owner side of the live stats segment (layout in stats/layout.h). Created at
// start-up, slots handed out to communicators and links, removed at clean exit.
// If creation fails (no /dev/shm, no space) the rank runs on with a private
// in-memory segment and one warning: telemetry never stops a job.
#include <cstddef>
#include <memory>
#include <string>

#include "hetobs/stats/layout.h"

namespace hetobs {
namespace stats {

struct SegmentConfig {
  std::string job;
  int rank = 0;
  int world_size = 1;
  std::string host;
  double hang_timeout_s = 300;
  uint32_t comm_capacity = 256;
  uint32_t link_capacity = 1024;
  uint32_t record_capacity = 2048;
};

class Segment {
 public:
  static std::unique_ptr<Segment> create(const SegmentConfig& cfg);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  StatsHeader* header() const { return reinterpret_cast<StatsHeader*>(base_); }
  OpRecord* records() const;
  // A fresh slot, or nullptr when full (callers then keep private memory).
  CommStats* allocComm();
  LinkStats* allocLink();
  const std::string& path() const { return path_; }  // empty for a private segment
  // Mark the rank as exited cleanly and remove the file (mapping stays valid).
  void markExited();

  static std::string pathFor(const std::string& job, int rank);

 private:
  Segment(std::string path, uint8_t* base, size_t size, bool shared);
  std::string path_;
  uint8_t* base_;
  size_t size_;
  bool shared_;
};

uint64_t processStartTicks(int pid);

}  // namespace stats
}  // namespace hetobs
