#include "hetobs/record/recorder.h"

#include <sched.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

#include "hetobs/common/json.h"
#include "hetobs/common/wire.h"

namespace hetobs {

const char* opStateName(OpState s) {
  static const char* kNames[] = {"enqueued", "started", "completed", "failed"};
  return uint8_t(s) < 4 ? kNames[uint8_t(s)] : "invalid";
}
const char* algorithmName(Algorithm a) {
  static const char* kNames[] = {"none", "ring", "direct", "chain", "p2p", "cma"};
  return uint8_t(a) < 6 ? kNames[uint8_t(a)] : "invalid";
}
const char* backendName(Backend b) {
  static const char* kNames[] = {"native", "gloo", "nccl", "mpi", "islands", "vendor"};
  return uint8_t(b) < 6 ? kNames[uint8_t(b)] : "invalid";
}
const char* deviceTypeName(DeviceType d) {
  static const char* kNames[] = {"cpu", "cuda", "other"};
  return uint8_t(d) < 3 ? kNames[uint8_t(d)] : "invalid";
}

const char* recordDevice(const OpRecord& r) { return r.device[0] ? r.device : deviceTypeName(DeviceType(r.device_type)); }

namespace {
const char* const kPhaseNames[kIslandPhases] = {"none", "vendor", "relay", "d2h", "wire", "h2d"};
}  // namespace

const char* islandPhaseName(IslandPhase p) { return uint8_t(p) < kIslandPhases ? kPhaseNames[uint8_t(p)] : "invalid"; }

bool islandPhaseFromName(const char* name, IslandPhase* out) {
  for (int i = 0; i < kIslandPhases; ++i)
    if (strcmp(name, kPhaseNames[i]) == 0) {
      *out = IslandPhase(i);
      return true;
    }
  return false;
}

// nccl-tests' formulas exactly (all_reduce.cu 2(n-1)/n; all_gather.cu, reduce_scatter.cu,
// alltoall.cu, gather.cu, scatter.cu (n-1)/n; broadcast, reduce, sendrecv 1), at every n: at one
// rank the (n-1)/n family is 0, as all_reduce's is, because no byte crosses a bus (the copy a
// one-rank all_gather makes is local). An earlier rule kept 1 there for every op but all_reduce,
// which disagreed with the benchmark's nccl-tests arithmetic. The one source of the factor:
// Python reads it through _core.busbw_factor (hetobs/codes.py).
double busBwFactor(uint8_t op, int n) {
  const double ranks = n < 1 ? 1.0 : double(n);  // a size not known yet counts as one rank
  switch (OpKind(op)) {
    case OpKind::kAllReduce:
      return 2.0 * (ranks - 1) / ranks;
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
    case OpKind::kGather:
    case OpKind::kScatter:
      return (ranks - 1) / ranks;
    default:
      return 1.0;
  }
}

Recorder& Recorder::instance() {
  // Leaked on purpose: ops may still retire from other threads during exit.
  static Recorder* r = new Recorder();
  return *r;
}

Recorder::Recorder() { configure(2048); }

void Recorder::configure(size_t capacity) {
  if (capacity == 0) capacity = 1;
  if (capacity == capacity_) return;
  storage_.assign(capacity * sizeof(OpRecord) + 64, 0);
  void* p = storage_.data();
  size_t space = storage_.size();
  p = std::align(64, capacity * sizeof(OpRecord), p, space);
  slots_ = static_cast<OpRecord*>(p);
  for (size_t i = 0; i < capacity; ++i) new (&slots_[i]) OpRecord();
  setCapacity(capacity);
  next_ = &ownNext_;
  next_->store(0);
}

void Recorder::setCapacity(size_t capacity) {
  capacity_ = capacity;
  mask_ = capacity && (capacity & (capacity - 1)) == 0 ? capacity - 1 : 0;  // capacity 1: mask 0, id % 1
}

void Recorder::attach(OpRecord* slots, size_t capacity, std::atomic<uint64_t>* next) {
  for (size_t i = 0; i < capacity; ++i) new (&slots[i]) OpRecord();
  slots_ = slots;
  setCapacity(capacity);
  next_ = next;
  next_->store(0);
}

namespace {
// Readers copy a slot word by word with relaxed loads while a writer may be inside (the
// seqlock then has them retry). Writers own the slot (below), so they never overlap each
// other; the reader's overlap is the seqlock's by design, hidden from ThreadSanitizer,
// which would otherwise report every optimistic read: writer-against-writer races, the
// ones that tear records, stay visible to it.
static_assert(sizeof(OpRecord) % 8 == 0 && alignof(OpRecord) >= 8, "records are copied in 8-byte words");
constexpr size_t kWords = sizeof(OpRecord) / 8;

__attribute__((no_sanitize_thread)) void loadBody(const OpRecord* s, OpRecord* out) {
  const uint64_t* src = reinterpret_cast<const uint64_t*>(s);
  uint64_t* dst = reinterpret_cast<uint64_t*>(out);
  for (size_t i = 1; i < kWords; ++i) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

// A consistent copy of slot `s`; false if writers kept it busy.
bool readSlot(const OpRecord* s, OpRecord* out) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    uint64_t v1 = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
    if (v1 & 1) continue;
    loadBody(s, out);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (__atomic_load_n(&s->version, __ATOMIC_RELAXED) != v1) continue;
    return true;
  }
  return false;
}

// Ownership. A slot belongs to the op whose begin() filled it until that op is marked
// finished: begin() takes only a slot that is empty or holds a finished op, with one
// compare-and-swap on the version (it arbitrates begin()s that wrapped onto one slot), and
// skips a slot whose op is still in flight (that record outlives the wrap, for the watchdog
// and dumps). The owner is then the slot's only writer, so markStarted/markFinished write
// under the seqlock with plain stores: no read-modify-write on the hot path.
constexpr int kMaxSkips = 8;  // in-flight slots in a row before an op goes unrecorded

bool inFlight(uint8_t state) { return state == uint8_t(OpState::kEnqueued) || state == uint8_t(OpState::kStarted); }

// Optimistic peeks at a slot another writer may be filling: validated by the version (begin's
// compare-and-swap) or by the write order of begin() (record id before state), the seqlock's
// overlap by design, hidden from ThreadSanitizer like loadBody.
__attribute__((no_sanitize_thread)) uint8_t peekState(const OpRecord* s) {
  return __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
}
__attribute__((no_sanitize_thread)) uint64_t peekId(const OpRecord* s) {
  return __atomic_load_n(&s->record_id, __ATOMIC_RELAXED);
}

// Take slot `s` for a new record: false while its op is in flight.
bool tryClaim(OpRecord* s, uint64_t* v) {
  for (unsigned spins = 0;; ++spins) {
    uint64_t cur = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
    if (cur & 1) {  // a begin() that wrapped onto this slot is inside: wait it out (one record write)
      if (spins > 64) sched_yield();
      continue;
    }
    if (cur != 0 && inFlight(peekState(s))) return false;  // version 0: never written
    if (__atomic_compare_exchange_n(&s->version, &cur, cur | 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
      std::atomic_thread_fence(std::memory_order_release);  // body stores stay after the odd version
      *v = cur;
      return true;
    }
  }
}

// Everything after the version and the record id. Fixed 32-byte pieces, which the compiler
// turns into vector moves: the memcpy it would make of the whole (rep movs) starts slower.
void copyBody(const OpRecord& from, OpRecord* to) {
  constexpr size_t kHead = offsetof(OpRecord, record_id) + sizeof(uint64_t);
  constexpr size_t kPiece = 32;
  constexpr size_t kPieces = (sizeof(OpRecord) - kHead) / kPiece;
  const char* src = reinterpret_cast<const char*>(&from) + kHead;
  char* dst = reinterpret_cast<char*>(to) + kHead;
#pragma GCC unroll 16
  for (size_t i = 0; i < kPieces; ++i) memcpy(dst + i * kPiece, src + i * kPiece, kPiece);
  constexpr size_t kDone = kPieces * kPiece;
  memcpy(dst + kDone, src + kDone, sizeof(OpRecord) - kHead - kDone);
}

void release(OpRecord* s, uint64_t v) { __atomic_store_n(&s->version, v + 2, __ATOMIC_RELEASE); }

}  // namespace

bool Recorder::get(uint64_t id, OpRecord* out) const {
  return readSlot(slotFor(id), out) && out->record_id == id;
}

uint64_t Recorder::begin(const OpRecord& init) {
  uint64_t id = next_->fetch_add(1, std::memory_order_relaxed);
  OpRecord* s = slotFor(id);
  uint64_t v;
  for (int skips = 0; !tryClaim(s, &v); ++skips) {
    if (skips == kMaxSkips) return id;  // the ring is all in flight here: this op goes unrecorded
    id = next_->fetch_add(1, std::memory_order_relaxed);
    s = slotFor(id);
  }
  // The id goes in before the state: an update that sees this record's state also sees its id.
  s->record_id = id;
  std::atomic_thread_fence(std::memory_order_release);
  copyBody(init, s);
  release(s, v);
  return id;
}

template <class F>
void Recorder::update(uint64_t id, F&& f) {
  OpRecord* s = slotFor(id);
  uint64_t v = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
  // Not ours (any more): a newer record holds the slot, or this op was already marked finished.
  if ((v & 1) || !inFlight(peekState(s)) || peekId(s) != id) return;
  __atomic_store_n(&s->version, v + 1, __ATOMIC_RELAXED);
  std::atomic_thread_fence(std::memory_order_release);  // body stores stay after the odd version
  f(*s);
  release(s, v);
}

void Recorder::markStarted(uint64_t id, int64_t t_ns) {
  update(id, [&](OpRecord& r) {
    r.t_start_ns = t_ns;
    r.state = uint8_t(OpState::kStarted);
  });
}

void Recorder::markFinished(uint64_t id, int64_t t_ns, bool ok, const char* error, const IslandPhases* phases,
                            const ArrivalInfo* arrival) {
  update(id, [&](OpRecord& r) {
    if (phases) r.phases = *phases;
    if (arrival) {
      r.last_arrival_rank = arrival->last_rank;
      r.arrival_flags = arrival->flags;
      r.arrival_lag_ns = arrival->lag_ns;
      r.behind_first_ns = arrival->behind_first_ns;
    }
    r.t_end_ns = t_ns;
    int64_t dt = t_ns - (r.t_start_ns ? r.t_start_ns : r.t_enqueue_ns);
    if (ok && dt > 0) {
      r.algbw_gbps = double(r.bytes) / double(dt);  // bytes per ns == GB/s
      r.busbw_gbps = r.algbw_gbps * busBwFactor(r.op, r.comm_size);
    }
    if (error) {
      // Cut at a character boundary: half a UTF-8 character would make the dump's text invalid.
      size_t n = utf8PrefixLen(error, strlen(error), sizeof(r.error) - 1);
      memcpy(r.error, error, n);
      r.error[n] = 0;
    }
    r.state = uint8_t(ok ? OpState::kCompleted : OpState::kFailed);
  });
}

std::vector<OpRecord> Recorder::snapshot() const {
  std::vector<OpRecord> out;
  uint64_t end = next_->load(std::memory_order_acquire);
  uint64_t begin = end > capacity_ ? end - capacity_ : 0;
  out.reserve(size_t(end - begin));
  for (uint64_t id = begin; id < end; ++id) {
    OpRecord copy{};
    if (readSlot(slotFor(id), &copy) && copy.record_id == id) out.push_back(copy);
  }
  return out;
}

}  // namespace hetobs
