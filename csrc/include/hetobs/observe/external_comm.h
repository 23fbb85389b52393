#pragma once
// A communicator of a vendor library (Gloo through torch, MPI, NCCL) whose ops are
// recorded from outside: the wrapper or interposer calls begin() before handing the
// op to the library and end() when it completes. The ops land in the same recorder,
// stats segment, watchdog and dumps as native ones.
//
// Threading: begin()/end() may be called from different threads (an op issued on
// one, completed by an event poller on another) and never lock: in-flight ops sit in
// a fixed table claimed with compare-and-swap, counters are atomic adds.
#include <atomic>
#include <memory>
#include <vector>

#include "hetobs/common/wire.h"
#include "hetobs/observe/external_hooks.h"
#include "hetobs/observe/observed.h"
#include "hetobs/record/op_record.h"
#include "hetobs/stats/layout.h"

namespace hetobs {

class ExternalComm : public Observed, public std::enable_shared_from_this<ExternalComm> {
 public:
  static constexpr size_t kMaxInFlight = 256;

  ExternalComm(uint64_t id, std::vector<int> globalRanks, int rank, Backend backend, DeviceType device,
               std::string name);
  // Take a stats slot and join the watchdog's registry (call once, after construction).
  void attach();

  // Record the start of an op; returns a token for end() (0 if the in-flight table is full:
  // the op is still recorded, only not watched).
  uint64_t begin(const ExternalOp& op);
  // startMono/endMono: when the op really ran (e.g. from CUDA events); 0 = begin() / now.
  void end(uint64_t token, bool ok, const char* error = nullptr, int64_t startMono = 0, int64_t endMono = 0);
  // World ranks of the members, once known (sub-communicators of an interposed library).
  void setGlobalRanks(std::vector<int> ranks);

  int rank() const { return rank_; }
  int size() const { return int(global_.size()); }
  uint64_t id() const { return id_; }

  uint64_t observedId() const override { return id_; }
  bool inFlight(InFlight* out) const override;
  void requestAbort(const std::string& why) override;
  void writeState(JsonWriter& w, int64_t nowMono) const override;
  void writeMetadata(JsonWriter& w) const override;

 protected:
  // A library that exposes per-peer progress (NCCL's profiler) fills these in: the
  // in-flight op's "peers" array and the comm's "links" array (empty by default).
  virtual void writePeers(JsonWriter& w, int64_t nowMono) const;
  virtual void writeLinks(JsonWriter& w) const;
  std::vector<int> global_;

 private:
  struct Slot {
    std::atomic<uint64_t> token{0};  // record id + 1 while in flight
    std::atomic<int64_t> start_ns{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint8_t> op{0};
  };
  uint64_t id_;
  int rank_;
  Backend backend_;
  DeviceType device_;
  std::string name_;
  std::atomic<uint64_t> collSeq_{0}, p2pSeq_{0};
  std::atomic<uint32_t> watched_{0};  // slots in use: end() need not scan the table to know
  stats::CommStats* cstats_ = nullptr;
  std::unique_ptr<stats::CommStats> ownStats_;
  Slot slots_[kMaxInFlight];
};

}  // namespace hetobs
