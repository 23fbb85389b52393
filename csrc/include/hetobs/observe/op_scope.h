#pragma once
// One op's scope outside the algorithm, shared by the native Communicator and ExternalComm
// (vendor libraries, islands): begin() writes its record and shows it in flight in the
// communicator's live stats slot (stats/layout.h CommStats); ended() folds it into the op-kind
// counters and counts as the rank's progress for the watchdog. Finishing the record stays
// with the caller: what it finishes with (an error, island phases, who arrived last) differs.
//
// What differs between the two users is who writes. A native communicator runs one op at a
// time on one thread: each update is bracketed by the slot's seqlock, so a reader never sees
// half of one. A vendor library's ops begin and end on several threads: each field is an
// atomic store (release) or add, and a reader may see one op's counters half-added.
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "hetobs/common/clock.h"
#include "hetobs/common/wire.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/record/op_record.h"
#include "hetobs/record/recorder.h"
#include "hetobs/stats/layout.h"
#include "hetobs/stats/op_stats.h"

namespace hetobs {

class OpScope {
 public:
  enum class Writers { kOne, kMany };

  void bind(stats::CommStats* slot, Writers writers) {
    c_ = slot;
    writers_ = writers;
  }

  // Record the op (`rec` with its seq and start filled) and show it in flight; the record id.
  uint64_t begin(const OpRecord& rec) {
    uint64_t rid = Recorder::instance().begin(rec);
    const bool p2p = isP2P(OpKind(rec.op));
    const int64_t startWall = monoToWallNs(rec.t_start_ns);
    update([&](stats::CommStats& c, auto, auto set) {
      set(p2p ? c.p2p_seq : c.coll_seq, p2p ? rec.p2p_seq : rec.coll_seq);
      set(c.inflight_op, uint32_t(rec.op));
      set(c.inflight_start_ns, startWall);
      set(c.inflight_record, rid + 1);  // last: a reader that sees the record sees the rest
    });
    return rid;
  }

  // The op ended at `endMono` after `durNs`: its kind's counters (an out-of-range kind is never
  // counted); `idle`: no other op of the communicator is in flight now. more(c, add, set)
  // writes further fields in the same update (the native communicator's arrivals).
  template <class More>
  void ended(uint8_t op, uint64_t bytes, int64_t durNs, int64_t endMono, bool ok, double busFactor, bool idle,
             More more) {
    update([&](stats::CommStats& c, auto add, auto set) {
      if (op < stats::kOpKinds) stats::noteOpEnd(c.ops[op], bytes, durNs, ok, busFactor, add);
      if (!ok) set(c.failed, 1u);
      more(c, add, set);
      if (idle) set(c.inflight_record, uint64_t(0));
    });
    if (Runtime* rt = Runtime::get()) rt->noteProgressAt(endMono);
  }
  void ended(uint8_t op, uint64_t bytes, int64_t durNs, int64_t endMono, bool ok, double busFactor, bool idle) {
    ended(op, bytes, durNs, endMono, ok, busFactor, idle, [](stats::CommStats&, auto, auto) {});
  }

  // One update of the slot: write(c, add, set), where add(counter, n) and set(field, value)
  // are plain under the seqlock (kOne) or atomic (kMany). Nothing without a slot.
  template <class Write>
  void update(Write write) {
    if (!c_) return;
    if (writers_ == Writers::kOne) {
      uint64_t v = __atomic_load_n(&c_->version, __ATOMIC_RELAXED);
      __atomic_store_n(&c_->version, v + 1, __ATOMIC_RELAXED);
      std::atomic_thread_fence(std::memory_order_release);
      write(*c_, [](uint64_t& counter, uint64_t n) { counter += n; },
            [](auto& field, auto value) { field = std::remove_reference_t<decltype(field)>(value); });
      __atomic_store_n(&c_->version, v + 2, __ATOMIC_RELEASE);
    } else {
      write(*c_, [](uint64_t& counter, uint64_t n) { __atomic_fetch_add(&counter, n, __ATOMIC_RELAXED); },
            [](auto& field, auto value) {
              __atomic_store_n(&field, std::remove_reference_t<decltype(field)>(value), __ATOMIC_RELEASE);
            });
    }
  }

 private:
  stats::CommStats* c_ = nullptr;
  Writers writers_ = Writers::kOne;
};

}  // namespace hetobs
