#include "hetobs/record/recorder.h"

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
  static const char* kNames[] = {"none", "ring", "direct", "chain", "p2p"};
  return uint8_t(a) < 5 ? kNames[uint8_t(a)] : "invalid";
}
const char* backendName(Backend b) {
  static const char* kNames[] = {"native", "gloo", "nccl", "mpi", "islands"};
  return uint8_t(b) < 5 ? kNames[uint8_t(b)] : "invalid";
}
const char* deviceTypeName(DeviceType d) { return d == DeviceType::kCuda ? "cuda" : "cpu"; }

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

double busBwFactor(uint8_t op, int n) {
  if (n <= 1) return op == uint8_t(OpKind::kAllReduce) ? 0.0 : 1.0;
  switch (OpKind(op)) {
    case OpKind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
    case OpKind::kGather:
    case OpKind::kScatter:
      return double(n - 1) / n;
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
  capacity_ = capacity;
  next_ = &ownNext_;
  next_->store(0);
}

void Recorder::attach(OpRecord* slots, size_t capacity, std::atomic<uint64_t>* next) {
  for (size_t i = 0; i < capacity; ++i) new (&slots[i]) OpRecord();
  slots_ = slots;
  capacity_ = capacity;
  next_ = next;
  next_->store(0);
}

bool Recorder::get(uint64_t id, OpRecord* out) const {
  const OpRecord* s = slotFor(id);
  for (int attempt = 0; attempt < 64; ++attempt) {
    uint64_t v1 = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
    if (v1 & 1) continue;
    memcpy(reinterpret_cast<char*>(out) + sizeof(out->version), reinterpret_cast<const char*>(s) + sizeof(s->version),
           sizeof(OpRecord) - sizeof(s->version));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (__atomic_load_n(&s->version, __ATOMIC_RELAXED) != v1) continue;
    return out->record_id == id;
  }
  return false;
}

uint64_t Recorder::begin(const OpRecord& init) {
  uint64_t id = next_->fetch_add(1, std::memory_order_relaxed);
  OpRecord* s = slotFor(id);
  uint64_t v = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
  __atomic_store_n(&s->version, v | 1, __ATOMIC_RELAXED);
  std::atomic_thread_fence(std::memory_order_release);
  // Copy everything after `version`.
  memcpy(reinterpret_cast<char*>(s) + sizeof(s->version), reinterpret_cast<const char*>(&init) + sizeof(init.version),
         sizeof(OpRecord) - sizeof(s->version));
  s->record_id = id;
  __atomic_store_n(&s->version, (v | 1) + 1, __ATOMIC_RELEASE);
  return id;
}

template <class F>
void Recorder::update(uint64_t id, F&& f) {
  OpRecord* s = slotFor(id);
  uint64_t v = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
  if (v & 1 || s->record_id != id) return;  // overwritten (or being overwritten): drop
  __atomic_store_n(&s->version, v | 1, __ATOMIC_RELAXED);
  std::atomic_thread_fence(std::memory_order_release);
  if (s->record_id == id) f(*s);
  __atomic_store_n(&s->version, (v | 1) + 1, __ATOMIC_RELEASE);
}

void Recorder::markStarted(uint64_t id, int64_t t_ns) {
  update(id, [&](OpRecord& r) {
    r.t_start_ns = t_ns;
    r.state = uint8_t(OpState::kStarted);
  });
}

void Recorder::markFinished(uint64_t id, int64_t t_ns, bool ok, const char* error, const IslandPhases* phases) {
  update(id, [&](OpRecord& r) {
    if (phases) r.phases = *phases;
    r.t_end_ns = t_ns;
    r.state = uint8_t(ok ? OpState::kCompleted : OpState::kFailed);
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
  });
}

std::vector<OpRecord> Recorder::snapshot() const {
  std::vector<OpRecord> out;
  uint64_t end = next_->load(std::memory_order_acquire);
  uint64_t begin = end > capacity_ ? end - capacity_ : 0;
  out.reserve(size_t(end - begin));
  for (uint64_t id = begin; id < end; ++id) {
    const OpRecord* s = slotFor(id);
    for (int attempt = 0; attempt < 64; ++attempt) {
      uint64_t v1 = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
      if (v1 & 1) continue;
      OpRecord copy{};
      memcpy(reinterpret_cast<char*>(&copy) + sizeof(copy.version),
             reinterpret_cast<const char*>(s) + sizeof(s->version), sizeof(OpRecord) - sizeof(s->version));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (__atomic_load_n(&s->version, __ATOMIC_RELAXED) != v1) continue;
      if (copy.record_id == id) out.push_back(copy);
      break;
    }
  }
  return out;
}

}  // namespace hetobs
