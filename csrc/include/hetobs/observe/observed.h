#pragma once
// What the watchdog and the dump writer need from anything that runs ops: the native
// Communicator, or an ExternalComm standing for a vendor library's communicator
// (Gloo, NCCL, MPI) whose ops are recorded from outside.
#include <cstdint>
#include <string>
#include <vector>

#include "hetobs/common/json.h"

namespace hetobs {

// One peer an op in flight still waits on, in one direction (dump 2.1 "waiting_on"):
// messages posted toward it (or from it) that are not done.
struct WaitedPeer {
  int rank;        // global rank
  bool send;       // direction: true = this rank still sends to it, false = still receives from it
  uint64_t posted, done;
};

class Observed {
 public:
  virtual ~Observed() = default;

  struct InFlight {
    uint64_t record_id;
    int64_t start_ns;          // monotonic
    int64_t last_progress_ns;  // monotonic: op start or the latest per-peer change
    std::string waiting_on;    // peers with unfinished messages, if known (text for people)
    std::vector<WaitedPeer> waits;  // the same as data, one element per peer and direction
  };
  virtual uint64_t observedId() const = 0;
  // The oldest running op, if any. Any thread.
  virtual bool inFlight(InFlight* out) const = 0;
  // Make the running op fail (HETOBS_ABORT_ON_HANG); best effort for external ops.
  virtual void requestAbort(const std::string& why) = 0;
  virtual void writeState(JsonWriter& w, int64_t nowMono) const = 0;   // dump "comms" entry
  virtual void writeMetadata(JsonWriter& w) const = 0;                // rank file "comms" entry
  // Refresh per-link kernel state (TCP_INFO) in the stats segment; the watchdog calls it
  // about once a second. Nothing for communicators without sockets of their own.
  virtual void sampleLinkHealth() const {}
};

}  // namespace hetobs
