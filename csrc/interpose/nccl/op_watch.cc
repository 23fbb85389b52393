#include "op_watch.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "cuda_rt.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/index_stack.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/record/recorder.h"
#include "nccl_state.h"

namespace hetobs {
namespace nccl {
namespace {

constexpr uint32_t kSlots = 4096;
constexpr int64_t kPollNs = 1000000;          // 1 ms between passes while ops are pending
constexpr int64_t kBusyPollNs = 100000;       // 100 us after a pass that ended ops (more may be due)
constexpr int64_t kAsyncCheckNs = 100000000;  // ask NCCL for async errors every 100 ms

// kClaimed: owned by the thread that issued the op (until afterOp / groupEnd publishes it).
enum : uint32_t { kFree = 0, kClaimed, kEnqueueWait, kWatching };

struct Slot {
  std::atomic<uint32_t> state{kFree};
  std::shared_ptr<NcclComm> comm;
  uint64_t token = 0;
  cudaStream_t stream = nullptr;
  int device = -1;
  int evDevice = -1;  // device the events were created on
  cudaEvent_t start = nullptr, end = nullptr;
  bool hasStart = false;
  bool grouped = false;
  ncclResult_t callResult = ncclSuccess;  // a grouped op's own call result
  uint32_t next = kNoSlot;                // next op of the same group (issuing thread's list)
  uint32_t index = 0;
};

struct Watcher {
  Watcher() {
    for (uint32_t i = 0; i < kSlots; ++i) slots[i].index = i;
  }
  Slot slots[kSlots];
  // Free slots, most recently freed first: the slots in use, and their CUDA events, stay few.
  IndexStack<kSlots> free;
  static_assert(IndexStack<kSlots>::kNone == kNoSlot, "an empty free list reads as no slot");
  std::atomic<uint32_t> highWater{0};
  std::atomic<uint32_t> active{0};
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> sleeping{false};
  std::atomic<bool> stop{false}, started{false}, stopped{false};
  std::once_flag once;
};

Watcher& watcher() {
  static Watcher* w = new Watcher();  // leaked: the poller may run until exit
  return *w;
}

struct GroupState {
  int depth = 0;
  uint32_t head = kNoSlot, tail = kNoSlot;
};
GroupState& group() {
  static thread_local GroupState g;
  return g;
}

uint64_t recordIdOf(uint64_t token) { return (token & ~(1ull << 63)) - 1; }

uint32_t claim() {
  Watcher& w = watcher();
  uint32_t i = w.free.pop();
  if (i == kNoSlot) return kNoSlot;
  w.slots[i].state.store(kClaimed, std::memory_order_relaxed);
  uint32_t hw = w.highWater.load(std::memory_order_relaxed);
  while (hw < i + 1 && !w.highWater.compare_exchange_weak(hw, i + 1, std::memory_order_relaxed)) {
  }
  w.active.fetch_add(1, std::memory_order_relaxed);
  return i;
}

void release(Slot& s) {
  Watcher& w = watcher();
  s.comm.reset();
  s.token = 0;
  s.state.store(kFree, std::memory_order_release);
  w.active.fetch_sub(1, std::memory_order_relaxed);
  w.free.push(s.index);
}

// End the op: the record gets the GPU's duration (start = completion seen - elapsed).
// `rejected`: NCCL refused the call itself (the application got the error back and
// nothing ran), which does not make the exit unclean; a failure of a running op does.
void finish(Slot& s, bool ok, const char* error, int64_t elapsedNs = 0, bool rejected = false) {
  if (ok && elapsedNs > 0) Recorder::instance().markStarted(recordIdOf(s.token), monoNs() - elapsedNs);
  s.comm->end(s.token, ok, error);
  if (!ok && !rejected) drops().opsFailed.store(true, std::memory_order_relaxed);
  release(s);
}

bool ensureEvents(const CudaRt& rt, Slot& s) {
  if (s.start && s.evDevice == s.device) return true;
  DeviceGuard g(rt, s.device);
  if (!g.ok()) return false;
  cudaEvent_t a = nullptr, b = nullptr;
  if (rt.eventCreateWithFlags(&a, cudaEventDefault) != cudaSuccess ||
      rt.eventCreateWithFlags(&b, cudaEventDefault) != cudaSuccess) {
    rt.getLastError();
    return false;  // (the first of a half-made pair is left behind: the device is in trouble anyway)
  }
  s.start = a;  // events made on another device earlier are left behind: rare, and small
  s.end = b;
  s.evDevice = s.device;
  return true;
}

bool record(const CudaRt& rt, Slot& s, cudaEvent_t ev) {
  DeviceGuard g(rt, s.evDevice);
  if (rt.eventRecord(ev, s.stream) == cudaSuccess) return true;
  rt.getLastError();  // do not leave our error for the application's cudaGetLastError
  return false;
}

void wakePoller() {
  Watcher& w = watcher();
  if (w.sleeping.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> g(w.mu);
    w.cv.notify_one();
  }
}

// The NCCL call returned (or the group that holds the op was launched) with `r`.
void launched(const CudaRt& rt, Slot& s, ncclResult_t r) {
  if (r == ncclSuccess) {
    if (!record(rt, s, s.end)) {
      finish(s, true, nullptr);  // cannot watch it: end it as the host saw it
      return;
    }
    s.state.store(kWatching, std::memory_order_release);
  } else if (r == ncclInProgress) {
    s.state.store(kEnqueueWait, std::memory_order_release);
  } else {
    finish(s, false, ncclErrorString(r), 0, true);
    return;
  }
  wakePoller();
}

// The comm's op failed asynchronously: dump this rank (and ask the others) now, in the
// poller's thread, while the op is still in flight; its slots are ended after.
void errorDump(NcclComm& c, ncclResult_t err) {
  if (c.errorDumped) return;
  c.errorDumped = true;
  Runtime* rt = Runtime::get();
  Observed::InFlight f;
  OpRecord r{};
  if (!rt || !c.inFlight(&f) || !Recorder::instance().get(f.record_id, &r)) return;
  bool p2p = isP2P(OpKind(r.op));
  DumpRequest req;
  req.incident = p2p ? strFormat("error-c%llu-p%llu-r%d", (unsigned long long)c.id(), (unsigned long long)r.p2p_seq,
                                 rt->config().rank)
                     : strFormat("error-c%llu-s%llu", (unsigned long long)c.id(), (unsigned long long)r.coll_seq);
  req.reason = "error";
  req.cause = strFormat("%s seq %llu on comm %llu failed: NCCL reports %s", opName(OpKind(r.op)),
                        (unsigned long long)(p2p ? r.p2p_seq : r.coll_seq), (unsigned long long)c.id(),
                        ncclErrorString(err));
  // NCCL names no culprit: the fields say what failed and who saw it.
  req.cause_info.kind = "other";
  req.cause_info.reporter = rt->config().rank;
  req.cause_info.op = opName(OpKind(r.op));
  req.cause_info.seq = int64_t(p2p ? r.p2p_seq : r.coll_seq);
  req.ask_peers = true;
  HETOBS_WARN("%s; dumping incident %s", req.cause.c_str(), req.incident.c_str());
  rt->dump(req);
}

// Ask NCCL whether the comm hit an asynchronous error (a dead peer, a network failure).
void checkAsync(NcclComm& c) {
  auto getAsync = HETOBS_REAL(ncclCommGetAsyncError, ncclResult_t (*)(ncclComm_t, ncclResult_t*));
  if (!getAsync) return;
  std::unique_lock<std::mutex> l(c.ncclMu, std::try_to_lock);
  if (!l.owns_lock() || c.closed) return;
  ncclResult_t e = ncclSuccess;
  if (getAsync(c.handle.load(), &e) != ncclSuccess || e == ncclSuccess || e == ncclInProgress) return;
  l.unlock();  // (a dump takes a while: do not hold up ncclCommDestroy)
  errorDump(c, e);
  c.asyncError.store(int(e));
}

void pollEnqueueWait(const CudaRt& rt, Slot& s) {
  NcclComm& c = *s.comm;
  auto getAsync = HETOBS_REAL(ncclCommGetAsyncError, ncclResult_t (*)(ncclComm_t, ncclResult_t*));
  std::unique_lock<std::mutex> l(c.ncclMu, std::try_to_lock);
  if (!l.owns_lock()) return;
  ncclResult_t e = ncclSuccess;
  if (c.closed) {
    e = c.aborted ? ncclInvalidUsage : ncclSuccess;
  } else if (!getAsync || getAsync(c.handle.load(), &e) != ncclSuccess) {
    e = ncclSuccess;  // cannot tell: assume enqueued
  }
  l.unlock();
  if (e == ncclInProgress) return;
  if (c.aborted) {
    finish(s, false, "communicator aborted before the op was launched");
  } else if (e != ncclSuccess) {
    c.asyncError.store(int(e));
    finish(s, false, ncclErrorString(e));
  } else if (record(rt, s, s.end)) {
    s.state.store(kWatching, std::memory_order_release);
  } else {
    finish(s, true, nullptr);
  }
}

// One look at a watched op. `final`: the last sweep at exit, where a CUDA error means the
// runtime is going away (the application reset the device), not that the op failed.
void pollWatching(const CudaRt& rt, Slot& s, int* curDev, uint64_t pass, bool askAsync, bool final) {
  if (s.evDevice != *curDev) {
    if (rt.setDevice(s.evDevice) != cudaSuccess) rt.getLastError();
    *curDev = s.evDevice;
  }
  cudaError_t q = rt.eventQuery(s.end);
  if (q == cudaSuccess) {
    float ms = 0;
    if (!s.hasStart || rt.eventElapsedTime(&ms, s.start, s.end) != cudaSuccess) {
      rt.getLastError();
      ms = 0;
    }
    finish(s, true, nullptr, int64_t(double(ms) * 1e6));
  } else if (q == cudaErrorNotReady) {
    NcclComm& c = *s.comm;
    if (c.aborted.load()) {
      finish(s, false, "communicator aborted");
    } else if (int e = c.asyncError.load()) {
      finish(s, false, ncclErrorString(ncclResult_t(e)));
    } else if (askAsync && c.asyncCheckedPass != pass) {
      c.asyncCheckedPass = pass;
      checkAsync(c);
    }
  } else {
    rt.getLastError();
    if (final) {
      finish(s, true, nullptr);
      return;
    }
    std::string why = std::string("CUDA error while the op ran: ") + rt.getErrorString(q);
    finish(s, false, why.c_str());
  }
}

void pollerLoop() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  Watcher& w = watcher();
  const CudaRt& rt = *cudaRt();
  int curDev = -1;
  int64_t lastAsync = 0;
  uint64_t pass = 0;
  while (!w.stop.load(std::memory_order_acquire)) {
    if (w.active.load(std::memory_order_relaxed) == 0) {
      std::unique_lock<std::mutex> l(w.mu);
      w.sleeping.store(true, std::memory_order_release);
      w.cv.wait_for(l, std::chrono::milliseconds(50), [&] { return w.active.load() > 0 || w.stop.load(); });
      w.sleeping.store(false, std::memory_order_relaxed);
      continue;
    }
    int64_t now = monoNs();
    bool askAsync = now - lastAsync >= kAsyncCheckNs;
    if (askAsync) lastAsync = now;
    ++pass;
    uint32_t before = w.active.load(std::memory_order_relaxed);
    uint32_t hw = w.highWater.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < hw && !w.stop.load(std::memory_order_relaxed); ++i) {
      Slot& s = w.slots[i];
      uint32_t st = s.state.load(std::memory_order_acquire);
      if (st == kEnqueueWait) pollEnqueueWait(rt, s);
      else if (st == kWatching) pollWatching(rt, s, &curDev, pass, askAsync, false);
    }
    bool ended = w.active.load(std::memory_order_relaxed) < before;
    std::this_thread::sleep_for(std::chrono::nanoseconds(ended ? kBusyPollNs : kPollNs));
  }
  w.stopped.store(true, std::memory_order_release);
}

void ensurePoller() {
  Watcher& w = watcher();
  std::call_once(w.once, [&] {
    w.started = true;
    std::thread(pollerLoop).detach();
  });
}

}  // namespace

// CUDA events that cannot be made, op after op (a runtime without a usable device): stop trying.
static std::atomic<int> gEventFailures{0};
static constexpr int kEventFailuresToGiveUp = 16;

uint32_t beginOp(const std::shared_ptr<NcclComm>& comm, const ExternalOp& op, cudaStream_t stream) {
  const CudaRt* rt = cudaRt();
  if (!rt || !comm || gEventFailures.load(std::memory_order_relaxed) >= kEventFailuresToGiveUp) return kNoSlot;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (rt->streamIsCapturing(stream, &cs) != cudaSuccess) {
    rt->getLastError();
  } else if (cs != cudaStreamCaptureStatusNone) {
    drops().captured.fetch_add(1, std::memory_order_relaxed);  // runs at graph launch, not now
    return kNoSlot;
  }
  uint32_t idx = claim();
  if (idx == kNoSlot) {
    if (drops().slotsFull.fetch_add(1, std::memory_order_relaxed) == 0)
      HETOBS_WARN("NCCL interposer: more than %u ops in flight; further ops are not recorded until some complete",
                  kSlots);
    return kNoSlot;
  }
  Slot& s = watcher().slots[idx];
  s.device = comm->device();
  if (s.device < 0 && rt->getDevice(&s.device) != cudaSuccess) {
    rt->getLastError();
    s.device = 0;
  }
  if (!ensureEvents(*rt, s)) {
    release(s);
    if (gEventFailures.fetch_add(1, std::memory_order_relaxed) + 1 == kEventFailuresToGiveUp)
      HETOBS_WARN("NCCL interposer: CUDA events cannot be created (libcudart %s); NCCL ops are not recorded",
                  rt->path);
    return kNoSlot;
  }
  gEventFailures.store(0, std::memory_order_relaxed);
  s.comm = comm;
  s.stream = stream;
  s.hasStart = false;
  s.next = kNoSlot;
  s.callResult = ncclSuccess;
  s.token = comm->begin(op);
  GroupState& g = group();
  s.grouped = g.depth > 0;
  if (s.grouped) {  // NCCL launches it at the outermost ncclGroupEnd: events go around that
    if (g.head == kNoSlot) g.head = idx;
    else watcher().slots[g.tail].next = idx;
    g.tail = idx;
  } else {
    s.hasStart = record(*rt, s, s.start);
  }
  ensurePoller();
  return idx;
}

void afterOp(uint32_t idx, ncclResult_t r) {
  if (idx == kNoSlot) return;
  Slot& s = watcher().slots[idx];
  if (s.grouped) {
    s.callResult = r;
    return;
  }
  launched(*cudaRt(), s, r);
}

void groupStarted() { ++group().depth; }

ncclResult_t groupEnd(ncclResult_t (*realGroupEnd)()) {
  GroupState& g = group();
  if (g.depth > 0) --g.depth;
  if (g.depth > 0 || g.head == kNoSlot) return realGroupEnd();
  uint32_t head = g.head;
  g.head = g.tail = kNoSlot;
  const CudaRt& rt = *cudaRt();
  Watcher& w = watcher();
  for (uint32_t i = head; i != kNoSlot; i = w.slots[i].next) {
    Slot& s = w.slots[i];
    if (s.callResult == ncclSuccess || s.callResult == ncclInProgress) s.hasStart = record(rt, s, s.start);
  }
  ncclResult_t r = realGroupEnd();
  for (uint32_t i = head; i != kNoSlot;) {
    Slot& s = w.slots[i];
    uint32_t next = s.next;  // read before the slot is handed on
    if (s.callResult != ncclSuccess && s.callResult != ncclInProgress)
      finish(s, false, ncclErrorString(s.callResult), 0, true);
    else launched(rt, s, r);
    i = next;
  }
  return r;
}

void commClosed(NcclComm& comm, bool aborted) {
  std::lock_guard<std::mutex> g(comm.ncclMu);
  comm.closed = true;
  if (aborted) comm.aborted.store(true);
}

bool stopWatching() {
  Watcher& w = watcher();
  bool idle = w.active.load() == 0;
  if (!w.started.load()) return idle;
  w.stop.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> g(w.mu);
    w.cv.notify_all();
  }
  for (int i = 0; i < 200 && !w.stopped.load(std::memory_order_acquire); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!w.stopped.load()) return false;  // the poller is stuck in a CUDA call: leave it alone
  // Ops the application synchronized on just before exiting are done: see them ended.
  const CudaRt& rt = *cudaRt();
  int curDev = -1;
  uint32_t hw = w.highWater.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < hw; ++i) {
    Slot& s = w.slots[i];
    if (s.state.load(std::memory_order_acquire) == kWatching) pollWatching(rt, s, &curDev, 0, false, true);
  }
  return w.active.load() == 0;
}

}  // namespace nccl
}  // namespace hetobs
