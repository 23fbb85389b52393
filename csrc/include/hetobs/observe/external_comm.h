#pragma once
// A communicator of a vendor library (Gloo through torch, MPI, NCCL) whose ops are
// recorded from outside: the wrapper or interposer calls begin() before handing the
// op to the library and end() when it completes. The ops land in the same recorder,
// stats segment, watchdog and dumps as native ones.
//
// A hierarchical op of the "hetobs_islands" backend is one op here too: constructed with the
// rank's island, its record carries the island, setPhase() says which part runs now (shown
// in dumps, and a phase change counts as progress for the watchdog), and end() copies in
// the busy time of each phase.
//
// Threading: begin()/end()/setPhase() may be called from different threads (an op issued on
// one, completed by an event poller on another) and never lock: in-flight ops sit in
// a fixed table claimed with compare-and-swap, counters are atomic adds.
#include <atomic>
#include <memory>
#include <vector>

#include "hetobs/collectives/digest.h"
#include "hetobs/common/wire.h"
#include "hetobs/observe/external_hooks.h"
#include "hetobs/observe/observed.h"
#include "hetobs/observe/op_scope.h"
#include "hetobs/record/op_record.h"
#include "hetobs/stats/layout.h"

namespace hetobs {

class ExternalComm : public Observed, public std::enable_shared_from_this<ExternalComm> {
 public:
  static constexpr size_t kMaxInFlight = 256;

  // `island`: the rank's island for hierarchical ops ("" for a plain vendor communicator);
  // cut to kIslandNameBytes - 1 bytes.
  // `deviceName`: the device type by name when `device` is kOther (npu, standin, ...);
  // `library`: the collective library (for a hierarchical op, the one inside the island).
  // Both go into every record; cut to 15 bytes.
  ExternalComm(uint64_t id, std::vector<int> globalRanks, int rank, Backend backend, DeviceType device,
               std::string name, std::string island = "", std::string deviceName = "", std::string library = "");
  // Take a stats slot and join the watchdog's registry (call once, after construction).
  void attach();

  // Record the start of an op; returns a token for end() (0 if the in-flight table is full:
  // the op is still recorded, only not watched).
  uint64_t begin(const ExternalOp& op);
  // startMono/endMono: when the op really ran (e.g. from CUDA events); 0 = begin() / now.
  // phases: a hierarchical op's phase times (nullptr: none, the record keeps zeros).
  void end(uint64_t token, bool ok, const char* error = nullptr, int64_t startMono = 0, int64_t endMono = 0,
           const IslandPhases* phases = nullptr);
  // The in-flight op `token` is now in `phase`: two relaxed stores, no lock; ignored for an
  // unknown or unwatched token.
  void setPhase(uint64_t token, IslandPhase phase);
  // Result digests of a wrapped library's ops (HETOBS_DIGEST, docs/digests.md): whether the
  // collective `token` is to be checked (or, test only, has a bit flipped) once it completes.
  // One branch when digests are off.
  bool digestDue(uint64_t token) const;
  // Flip the test hook's bit in `data` if armed for this op, then compare the result's digest
  // with every rank's through `gather` (the library's own all_gather) when the op is sampled,
  // count it and, on a difference, report it (data_mismatch.h). Returns kDigestSame,
  // kDigestLogged or kDigestRaise, *msg set for the two last. Throws what `gather` throws.
  static constexpr int kDigestSame = 0, kDigestLogged = 1, kDigestRaise = 2;
  int checkResult(uint64_t token, uint8_t* data, size_t count, size_t es, const GatherFn& gather, std::string* msg);
  // World ranks of the members, once known (sub-communicators of an interposed library).
  void setGlobalRanks(std::vector<int> ranks);

  int rank() const { return rank_; }
  int size() const { return int(global_.size()); }
  uint64_t id() const { return id_; }
  const char* island() const { return island_; }

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
    std::atomic<int32_t> peer{-1};        // a point-to-point op's peer (comm rank), else -1
    std::atomic<uint8_t> phase{0};        // IslandPhase
    std::atomic<int64_t> phase_ns{0};     // monotonic time of the last phase change
  };
  Slot* slotOf(uint64_t token);
  const Slot* slotOf(uint64_t token) const;
  uint64_t id_;
  int rank_;
  Backend backend_;
  DeviceType device_;
  std::string name_;
  char island_[kIslandNameBytes] = {};
  char deviceName_[kDeviceNameBytes] = {};
  char library_[kLibraryNameBytes] = {};
  stats::StatsHeader* header_ = nullptr;  // the rank's segment header (island totals), if there is a runtime
  std::atomic<uint64_t> collSeq_{0}, p2pSeq_{0};
  std::atomic<uint32_t> watched_{0};  // slots in use: end() need not scan the table to know
  stats::CommStats* cstats_ = nullptr;
  std::unique_ptr<stats::CommStats> ownStats_;
  OpScope scope_;  // the op's record and stats slot (op_scope.h), many writers: begun and ended on any thread
  Slot slots_[kMaxInFlight];
};

}  // namespace hetobs
