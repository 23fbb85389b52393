#pragma once
// Fixed-capacity ring of OpRecords, oldest overwritten. Writers never lock or
// allocate: a slot is claimed with one fetch_add, updates check the slot still
// holds their record id (else it was overwritten and the update is dropped).
// Readers copy slots under a per-slot seqlock and never block writers.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hetobs/record/op_record.h"

namespace hetobs {

class Recorder {
 public:
  // The process-wide recorder (all communicators, all paths in).
  static Recorder& instance();

  // Resize (drops existing records). Call before the first op; not thread-safe with writers.
  void configure(size_t capacity);
  // Use external storage (the stats segment) for the ring and its end counter.
  void attach(OpRecord* slots, size_t capacity, std::atomic<uint64_t>* next);
  size_t capacity() const { return capacity_; }

  // Claim a slot and fill it from `init` (state, times...). Returns the record id.
  uint64_t begin(const OpRecord& init);
  // Mark started / finished. Cheap, lock-free; silently ignored if the slot was reused.
  // `phases`: a hierarchical op's phase times, copied in under the same seqlock write.
  void markFinished(uint64_t id, int64_t t_ns, bool ok, const char* error, const IslandPhases* phases = nullptr);
  void markStarted(uint64_t id, int64_t t_ns);
  // Oldest-first consistent copy of the live records.
  std::vector<OpRecord> snapshot() const;
  uint64_t nextId() const { return next_->load(std::memory_order_relaxed); }
  // The record with this id, if still in the ring (consistent copy).
  bool get(uint64_t id, OpRecord* out) const;

 private:
  Recorder();
  OpRecord* slotFor(uint64_t id) const { return &slots_[id % capacity_]; }
  template <class F> void update(uint64_t id, F&& f);

  OpRecord* slots_ = nullptr;
  size_t capacity_ = 0;
  std::atomic<uint64_t> ownNext_{0};
  std::atomic<uint64_t>* next_ = &ownNext_;
  std::vector<unsigned char> storage_;
};

}  // namespace hetobs
