#pragma once
// Fixed-capacity ring of OpRecords, the oldest finished one overwritten. Writers never lock
// or allocate: a record id is claimed with one fetch_add; begin() then takes the slot with
// one compare-and-swap on its seqlock version, and only a slot that is empty or holds a
// finished op (an op in flight keeps its slot through a wrap: begin() moves on to the next
// id). Until its op is marked finished the slot has that one writer, so the updates are
// plain stores under the seqlock. The record id is the slot's generation: updates, get()
// and snapshot() check it and drop or skip a slot reused by a newer record.
// Callers mark one record from one thread at a time and not after markFinished (a late
// call is dropped). Readers never block writers.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hetobs/record/arrival.h"
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

  // Claim a slot and fill it from `init` (state, times...). Returns the record id (not kept
  // when the slots it tried all held ops in flight: updates of it are then dropped).
  uint64_t begin(const OpRecord& init);
  // Mark started / finished. Cheap, lock-free; silently ignored if the slot was reused.
  // `phases`: a hierarchical op's phase times, copied in under the same seqlock write.
  // `arrival`: who arrived last at a collective (record/arrival.h), under the same write.
  void markFinished(uint64_t id, int64_t t_ns, bool ok, const char* error, const IslandPhases* phases = nullptr,
                    const ArrivalInfo* arrival = nullptr);
  void markStarted(uint64_t id, int64_t t_ns);
  // Oldest-first consistent copy of the live records.
  std::vector<OpRecord> snapshot() const;
  uint64_t nextId() const { return next_->load(std::memory_order_relaxed); }
  // The record with this id, if still in the ring (consistent copy).
  bool get(uint64_t id, OpRecord* out) const;

 private:
  Recorder();
  // A power-of-two ring (the default 2048) masks instead of dividing: a 64-bit division is
  // ~20 ns here, paid by begin() and each update.
  OpRecord* slotFor(uint64_t id) const { return &slots_[mask_ ? id & mask_ : id % capacity_]; }
  void setCapacity(size_t capacity);
  template <class F> void update(uint64_t id, F&& f);

  OpRecord* slots_ = nullptr;
  size_t capacity_ = 0;
  uint64_t mask_ = 0;  // capacity - 1 when capacity is a power of two, else 0
  std::atomic<uint64_t> ownNext_{0};
  std::atomic<uint64_t>* next_ = &ownNext_;
  std::vector<unsigned char> storage_;
};

}  // namespace hetobs
