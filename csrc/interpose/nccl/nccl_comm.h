#pragma once
// One NCCL communicator as hetobs sees it: an ExternalComm (ops recorded by the
// interposer, watched by the watchdog) plus per-peer proxy progress fed by the
// profiler plugin. The progress lives in the stats segment's link slots, like a
// native channel's, so `hetobs top` and a hung rank's readers see it live; dumps add
// it to the in-flight op ("peers") and the comm's "links".
//
// Progress counts are cumulative over the communicator's life. NCCL runs one
// communicator's ops in order, so when every rank is stuck in the same op the
// difference between a sender's `sent` and its receiver's `received` is that op's.
//   send: posted = proxy send ops started (messages), sent = steps handed to the
//         network, acked = steps the network completed, done = proxy send ops finished
//   recv: posted = proxy recv ops started, received = steps whose data arrived,
//         done = proxy recv ops finished
// Writers (NCCL's proxy thread) use atomic adds; readers take single loads.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hetobs/observe/external_comm.h"
#include "hetobs/stats/layout.h"
#include "nccl_api.h"

namespace hetobs {
namespace nccl {

class NcclComm : public ExternalComm {
 public:
  NcclComm(uint64_t id, std::vector<int> globalRanks, int rank, int device, std::string name);

  // The link slot of comm peer `peer` (allocated on first use; nullptr if out of range).
  stats::LinkStats* link(int peer);
  int device() const { return device_; }

  bool inFlight(InFlight* out) const override;

  // Set by the interposer; read by the profiler plugin when it binds to this comm.
  std::atomic<ncclComm_t> handle{nullptr};
  std::atomic<bool> profilerBound{false};
  // The interposer's view of the NCCL communicator's life. `ncclMu` is held by whoever
  // calls into NCCL for this comm from outside the application's threads (the poller),
  // and by destroy/abort while they set `closed`: after that nobody calls in again.
  std::mutex ncclMu;
  bool closed = false;                 // guarded by ncclMu
  std::atomic<bool> aborted{false};
  std::atomic<int> asyncError{0};      // ncclResult_t seen by ncclCommGetAsyncError, 0 = none
  std::atomic<uint32_t> splits{0};     // ncclCommSplit calls on this comm (child ids)
  uint64_t asyncCheckedPass = 0;       // poller only: last pass that asked NCCL for async errors
  bool errorDumped = false;            // poller only: the async error's dump was requested
  int64_t createdNs = 0;

 protected:
  void writePeers(JsonWriter& w, int64_t nowMono) const override;
  void writeLinks(JsonWriter& w) const override;

 private:
  int globalOf(int peer) const;

  int device_;
  std::unique_ptr<std::atomic<stats::LinkStats*>[]> links_;
  mutable std::mutex linkMu_;  // allocation only
  std::vector<std::unique_ptr<stats::LinkStats>> ownLinks_;
};

// Bump a progress or link counter: NCCL may drive one comm from more than one thread.
inline void bump(std::atomic<uint64_t>& a, uint64_t by = 1) { a.fetch_add(by, std::memory_order_relaxed); }

}  // namespace nccl
}  // namespace hetobs
