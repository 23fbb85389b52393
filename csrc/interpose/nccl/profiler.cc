// The NCCL profiler plugin side of libhetobs_nccl.so (NCCL_PROFILER_PLUGIN=<path to it>).
// It asks NCCL only for proxy events (and, from v5, the API events that tell which
// communicator a thread's call belongs to) and turns each proxy operation and network
// step into per-peer progress of the communicator (nccl_comm.h):
//
//   ProxyOp start      -> send.posted / recv.posted      ProxyOp stop -> send.done / recv.done
//   step SendWait      -> send.sent (+ bytes, frames)    step stop (send) -> send.acked
//   step RecvFlushWait -> recv.received (+ bytes, frames)
//
// Each context (one per NCCL communicator) binds to the interposer's record of the same
// communicator: the comm being initialized or called on the current thread, else the
// one unclaimed comm of the same rank and size; with no interposer it makes its own,
// so the plugin also works alone (progress only: ops are recorded by the interposer).
//
// As NCCL's plugin contract asks, only init can fail (which turns the plugin off, e.g.
// under HETOBS_WATCHDOG=0); every other call returns ncclSuccess whatever happens.
// Event objects come from a fixed pool per context: no allocation per event.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "hetobs/common/clock.h"
#include "hetobs/common/log.h"
#include "nccl_api.h"
#include "nccl_state.h"

#define HETOBS_EXPORT extern "C" __attribute__((visibility("default")))

namespace hetobs {
namespace nccl {
namespace {

constexpr uint32_t kContextMagic = 0x78746368;  // "hctx"
constexpr uint32_t kOpMagic = 0x706f7068;       // "hpop"
constexpr uint32_t kStepMagic = 0x70747368;     // "hstp"
constexpr int kStepsPerOp = 8;                  // NCCL keeps at most NCCL_STEPS (8) steps of a proxy op in flight
constexpr uint32_t kPoolOps = 4096;             // proxy ops in flight per communicator

struct ProxyOp;

struct Step {
  uint32_t magic = kStepMagic;
  std::atomic<uint32_t> used{0};
  ProxyOp* op = nullptr;
  bool sent = false, received = false;
};

struct Context;

struct ProxyOp {
  uint32_t magic = kOpMagic;
  std::atomic<uint32_t> used{0};
  stats::LinkStats* link = nullptr;
  bool isSend = false;
  Step steps[kStepsPerOp];
};

struct Context {
  uint32_t magic = kContextMagic;
  int version = 0, nranks = 0, rank = 0;
  uint64_t commHash = 0;
  std::mutex mu;
  std::shared_ptr<NcclComm> comm;            // guarded by mu
  std::atomic<NcclComm*> target{nullptr};
  std::atomic<bool> fed{false};              // progress recorded: the binding is final
  std::atomic<ProxyOp*> pool{nullptr};       // allocated on the first proxy op (intra-node comms never need it)
  std::atomic<uint32_t> cursor{0};
};

void bindLocked(Context& ctx, std::shared_ptr<NcclComm> c) {
  ctx.comm = std::move(c);
  ctx.comm->profilerBound.store(true);
  ctx.target.store(ctx.comm.get(), std::memory_order_release);
}

// A thread's call names its comm exactly: bind to it unless progress already went elsewhere.
void bindToHint(Context& ctx, NcclComm* hint) {
  if (!hint || ctx.target.load(std::memory_order_acquire) == hint || ctx.fed.load()) return;
  if (hint->size() != ctx.nranks || hint->rank() != ctx.rank) return;
  std::shared_ptr<NcclComm> c = findComm(hint->handle.load());
  if (!c || c.get() != hint) {
    for (auto& u : unboundComms())
      if (u.get() == hint) c = u;
  }
  if (!c) return;
  std::lock_guard<std::mutex> g(ctx.mu);
  if (!ctx.fed.load()) bindLocked(ctx, std::move(c));
}

NcclComm* targetOf(Context& ctx) {
  if (NcclComm* t = ctx.target.load(std::memory_order_acquire)) return t;
  std::lock_guard<std::mutex> g(ctx.mu);
  if (ctx.comm) return ctx.comm.get();
  std::shared_ptr<NcclComm> pick;
  for (auto& c : unboundComms()) {  // oldest first
    if (c->size() == ctx.nranks && c->rank() == ctx.rank) {
      pick = c;
      break;
    }
  }
  if (!pick) {
    Process* p = process();
    if (!p) return nullptr;
    pick = makeComm(*p, commIdFrom(&ctx.commHash, sizeof ctx.commHash, 0x9f0f), ctx.rank, ctx.nranks, -1);
    HETOBS_INFO("NCCL profiler: no interposed comm of rank %d/%d to attach progress to; recording it under comm %llu",
                ctx.rank, ctx.nranks, (unsigned long long)pick->id());
  }
  bindLocked(ctx, std::move(pick));
  return ctx.comm.get();
}

ProxyOp* allocOp(Context& ctx) {
  ProxyOp* pool = ctx.pool.load(std::memory_order_acquire);
  if (!pool) {
    std::lock_guard<std::mutex> g(ctx.mu);
    pool = ctx.pool.load();
    if (!pool) {
      pool = new (std::nothrow) ProxyOp[kPoolOps];
      if (!pool) return nullptr;
      ctx.pool.store(pool, std::memory_order_release);
    }
  }
  uint32_t start = ctx.cursor.fetch_add(1, std::memory_order_relaxed);
  for (uint32_t n = 0; n < kPoolOps; ++n) {
    ProxyOp& op = pool[(start + n) % kPoolOps];
    uint32_t expect = 0;
    if (op.used.load(std::memory_order_relaxed) == 0 &&
        op.used.compare_exchange_strong(expect, 1, std::memory_order_acq_rel))
      return &op;
  }
  return nullptr;
}

Step* allocStep(ProxyOp& op) {
  for (Step& s : op.steps) {
    uint32_t expect = 0;
    if (s.used.load(std::memory_order_relaxed) == 0 &&
        s.used.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) {
      s.op = &op;
      s.sent = s.received = false;
      return &s;
    }
  }
  return nullptr;
}

void dropped() { drops().profilerEvents.fetch_add(1, std::memory_order_relaxed); }

void touch(stats::LinkStats& l) {
  int64_t now = monoNs();
  l.progress.last_change_ns.store(now, std::memory_order_relaxed);
  l.counters.last_activity_ns.store(now, std::memory_order_relaxed);
}

Context* asContext(void* p) {
  auto* c = static_cast<Context*>(p);
  return c && c->magic == kContextMagic ? c : nullptr;
}

// ------------------------------------------------------------------ entry points

ncclResult_t initCommon(int version, void** context, int* mask, uint64_t commHash, int nranks, int rank) {
  if (context) *context = nullptr;
  if (!context || !mask || nranks <= 0 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (!startProcess(rank, nranks)) return ncclInvalidUsage;  // hetobs is off here: NCCL runs without us
  auto* ctx = new (std::nothrow) Context();  // freed never: NCCL may hand it back until finalize, and it is small
  if (!ctx) return ncclSystemError;
  ctx->version = version;
  ctx->nranks = nranks;
  ctx->rank = rank;
  ctx->commHash = commHash;
  bindToHint(*ctx, threadHint().init);  // the interposer is creating this comm on this thread
  *mask = ncclProfileProxyOp | ncclProfileProxyStep;
  if (version >= 5) *mask |= ncclProfileCollApi | ncclProfileP2pApi;
  *context = ctx;
  return ncclSuccess;
}

ncclResult_t startCommon(void* context, void** handle, uint64_t type, void* parent,
                         const hetobsProxyOpDescr* proxyOp) {
  if (handle) *handle = nullptr;
  Context* ctx = asContext(context);
  if (!ctx || !handle) return ncclSuccess;
  if (type == ncclProfileCollApi || type == ncclProfileP2pApi) {
    bindToHint(*ctx, threadHint().op);  // called inside the application's ncclAllReduce & co.
    return ncclSuccess;
  }
  if (type == ncclProfileProxyOp) {
    if (proxyOp->pid != getpid()) return ncclSuccess;  // PXN: another process's op, its parent is not ours
    NcclComm* comm = targetOf(*ctx);
    stats::LinkStats* link = comm ? comm->link(proxyOp->peer) : nullptr;
    ProxyOp* op = link ? allocOp(*ctx) : nullptr;
    if (!op) {
      dropped();
      return ncclSuccess;
    }
    ctx->fed.store(true, std::memory_order_relaxed);
    op->link = link;
    op->isSend = proxyOp->isSend != 0;
    bump(op->isSend ? link->progress.send_posted : link->progress.recv_posted);
    touch(*link);
    *handle = op;
    return ncclSuccess;
  }
  if (type == ncclProfileProxyStep) {
    auto* op = static_cast<ProxyOp*>(parent);
    if (!op || op->magic != kOpMagic || !op->used.load(std::memory_order_relaxed)) return ncclSuccess;
    Step* s = allocStep(*op);
    if (!s) {
      dropped();
      return ncclSuccess;
    }
    *handle = s;
  }
  return ncclSuccess;
}

void stepSent(Step& s, size_t bytes) {
  if (s.sent) return;
  s.sent = true;
  stats::LinkStats& l = *s.op->link;
  bump(l.progress.send_sent);
  bump(l.counters.frames_sent);
  bump(l.counters.bytes_sent, bytes);
  touch(l);
}

void stepReceived(Step& s, size_t bytes) {
  if (s.received) return;
  s.received = true;
  stats::LinkStats& l = *s.op->link;
  bump(l.progress.recv_received);
  bump(l.counters.frames_recv);
  bump(l.counters.bytes_recv, bytes);
  touch(l);
}

ncclResult_t recordState(void* handle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_t* args) {
  auto* s = static_cast<Step*>(handle);
  if (!s || s->magic != kStepMagic || !s->used.load(std::memory_order_relaxed)) return ncclSuccess;
  size_t bytes = args ? args->proxyStep.transSize : 0;
  if (state == ncclProfilerProxyStepSendWait && s->op->isSend) stepSent(*s, bytes);
  else if (state == ncclProfilerProxyStepRecvFlushWait && !s->op->isSend) stepReceived(*s, bytes);
  return ncclSuccess;
}

ncclResult_t stopEvent(void* handle) {
  if (!handle) return ncclSuccess;
  uint32_t magic = *static_cast<uint32_t*>(handle);
  if (magic == kStepMagic) {
    auto* s = static_cast<Step*>(handle);
    if (!s->used.load(std::memory_order_relaxed)) return ncclSuccess;
    stats::LinkStats& l = *s->op->link;
    if (s->op->isSend) {
      stepSent(*s, 0);  // (never seen handed to the network: it was, since it completed)
      bump(l.progress.send_acked);
    } else {
      stepReceived(*s, 0);
    }
    touch(l);
    s->used.store(0, std::memory_order_release);
  } else if (magic == kOpMagic) {
    auto* op = static_cast<ProxyOp*>(handle);
    if (!op->used.load(std::memory_order_relaxed)) return ncclSuccess;
    bump(op->isSend ? op->link->progress.send_done : op->link->progress.recv_done);
    touch(*op->link);
    for (Step& s : op->steps) s.used.store(0, std::memory_order_relaxed);
    op->used.store(0, std::memory_order_release);
  }
  return ncclSuccess;
}

ncclResult_t finalize(void* context) {
  Context* ctx = asContext(context);
  if (!ctx) return ncclSuccess;
  std::lock_guard<std::mutex> g(ctx->mu);
  ctx->magic = 0;  // NCCL sends nothing after finalize; anything that does is ignored
  ctx->target.store(nullptr);
  ctx->comm.reset();
  delete[] ctx->pool.exchange(nullptr);
  return ncclSuccess;
}

ncclResult_t initV4(void** context, int* mask, const char*, uint64_t commHash, int, int nranks, int rank,
                    ncclDebugLogger_t) {
  return initCommon(4, context, mask, commHash, nranks, rank);
}
ncclResult_t startV4(void* context, void** handle, ncclProfilerEventDescr_v4_t* d) {
  if (handle) *handle = nullptr;
  return d ? startCommon(context, handle, d->type, d->parentObj, &d->proxyOp) : ncclSuccess;
}
ncclResult_t initV5(void** context, uint64_t commId, int* mask, const char*, int, int nranks, int rank,
                    ncclDebugLogger_t) {
  return initCommon(5, context, mask, commId, nranks, rank);
}
ncclResult_t initV6(void** context, uint64_t commId, int* mask, const char*, int, int nranks, int rank,
                    ncclDebugLogger_t) {
  return initCommon(6, context, mask, commId, nranks, rank);
}
ncclResult_t startV5(void* context, void** handle, ncclProfilerEventDescr_v5_t* d) {
  if (handle) *handle = nullptr;
  return d ? startCommon(context, handle, d->type, d->parentObj, &d->proxyOp) : ncclSuccess;
}

}  // namespace
}  // namespace nccl
}  // namespace hetobs

// NCCL looks these up by name, newest first.
extern "C" {
__attribute__((visibility("default"))) ncclProfiler_v6_t ncclProfiler_v6 = {"hetobs", hetobs::nccl::initV6, hetobs::nccl::startV5,
                                                   hetobs::nccl::stopEvent, hetobs::nccl::recordState,
                                                   hetobs::nccl::finalize};
__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {"hetobs", hetobs::nccl::initV5, hetobs::nccl::startV5,
                                                   hetobs::nccl::stopEvent, hetobs::nccl::recordState,
                                                   hetobs::nccl::finalize};
__attribute__((visibility("default"))) ncclProfiler_v4_t ncclProfiler_v4 = {"hetobs", hetobs::nccl::initV4, hetobs::nccl::startV4,
                                                   hetobs::nccl::stopEvent, hetobs::nccl::recordState,
                                                   hetobs::nccl::finalize};
}  // extern "C"
