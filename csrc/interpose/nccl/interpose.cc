// The LD_PRELOAD side of libhetobs_nccl.so: NCCL's communicator and collective entry
// points, defined here, forward to the real ones (dlsym(RTLD_NEXT)) and record every
// op in the communicator's ExternalComm (backend nccl, device cuda), timed with CUDA
// events (op_watch.h). Without a CUDA runtime, with HETOBS_WATCHDOG=0 or with invalid
// settings, every call is forwarded untouched.
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "cuda_rt.h"
#include "hetobs/common/log.h"
#include "nccl_api.h"
#include "nccl_state.h"
#include "op_watch.h"

#define HETOBS_EXPORT extern "C" __attribute__((visibility("default")))

using namespace hetobs;
using namespace hetobs::nccl;

namespace {

ncclResult_t missing(const char* fn) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    fprintf(stderr, "hetobs: %s called, but no NCCL library follows libhetobs_nccl.so in this process\n", fn);
  return ncclSystemError;
}

#define REAL_OR_FAIL(fn, type)                 \
  auto real = HETOBS_REAL(fn, type);           \
  if (!real) return missing(#fn)

DType dtypeOf(ncclDataType_t t, size_t* elem) {
  switch (t) {
    case ncclInt8: *elem = 1; return DType::kInt8;
    case ncclUint8: *elem = 1; return DType::kUint8;
    case ncclInt32: *elem = 4; return DType::kInt32;
    case ncclUint32: *elem = 4; return DType::kInt32;    // hetobs has no unsigned 32/64: same size
    case ncclInt64: *elem = 8; return DType::kInt64;
    case ncclUint64: *elem = 8; return DType::kInt64;
    case ncclFloat16: *elem = 2; return DType::kFloat16;
    case ncclFloat32: *elem = 4; return DType::kFloat32;
    case ncclFloat64: *elem = 8; return DType::kFloat64;
    case ncclBfloat16: *elem = 2; return DType::kBFloat16;
    default: *elem = 1; return DType::kUint8;           // fp8 and later types: bytes are right
  }
}

RedOp redopOf(ncclRedOp_t op) {
  switch (op) {
    case ncclProd: return RedOp::kProd;
    case ncclMax: return RedOp::kMax;
    case ncclMin: return RedOp::kMin;
    case ncclAvg: return RedOp::kAvg;
    default: return RedOp::kSum;  // ncclSum, and user-defined (pre-multiplied) sums
  }
}

// The comm behind an NCCL handle, or nullptr when this process records nothing.
std::shared_ptr<NcclComm> commFor(ncclComm_t h) {
  if (!cudaRt()) return nullptr;
  if (auto c = findComm(h)) return c;
  if (processDisabled() || !h) return nullptr;
  return adoptComm(h);
}

// Shape of an op: elements in/out and bytes as nccl-tests counts them.
ExternalOp makeOp(OpKind kind, ncclDataType_t dt, uint64_t inCount, uint64_t outCount, uint64_t bytesCount,
                  RedOp redop = RedOp::kSum, int rootOrPeer = -1) {
  size_t es = 1;
  ExternalOp op;
  op.op = kind;
  op.dtype = dtypeOf(dt, &es);
  op.redop = redop;
  op.root_or_peer = rootOrPeer;
  op.count = inCount;
  op.out_count = outCount;
  op.bytes = bytesCount * es;
  return op;
}

template <class Shape, class Call>
ncclResult_t recorded(ncclComm_t comm, cudaStream_t stream, Shape&& shape, Call&& call) {
  std::shared_ptr<NcclComm> c = commFor(comm);
  if (!c) return call();
  uint32_t slot = beginOp(c, shape(uint64_t(c->size())), stream);
  ThreadHint& hint = threadHint();
  NcclComm* prev = hint.op;
  hint.op = c.get();  // the profiler plugin's API events on this thread belong to this comm
  ncclResult_t r = call();
  hint.op = prev;
  afterOp(slot, r);
  return r;
}

int currentDevice() {
  const CudaRt* rt = cudaRt();
  int dev = -1;
  if (rt && rt->getDevice(&dev) != cudaSuccess) {
    rt->getLastError();
    dev = -1;
  }
  return dev;
}

// Create the comm's record before NCCL initializes it (the profiler plugin's init runs
// inside that call and may bind to it), register it once NCCL returned its handle.
template <class Call>
ncclResult_t initOne(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, Call&& call) {
  Process* p = (cudaRt() && out) ? startProcess(rank, nranks) : nullptr;
  if (!p || nranks <= 0 || rank < 0 || rank >= nranks) return call();
  auto c = makeComm(*p, commIdFrom(id.internal, sizeof id.internal), rank, nranks, currentDevice(), false);
  noteUnbound(c);
  ThreadHint& hint = threadHint();
  hint.init = c.get();
  ncclResult_t r = call();
  hint.init = nullptr;
  if ((r == ncclSuccess || r == ncclInProgress) && *out) {
    attachComm(*c);
    addComm(*out, c);
  }
  return r;
}

}  // namespace

// ------------------------------------------------------------------ communicators

HETOBS_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  REAL_OR_FAIL(ncclCommInitRank, ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int));
  return initOne(comm, nranks, commId, rank, [&] { return real(comm, nranks, commId, rank); });
}

HETOBS_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                  ncclConfig_t* config) {
  REAL_OR_FAIL(ncclCommInitRankConfig, ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*));
  return initOne(comm, nranks, commId, rank, [&] { return real(comm, nranks, commId, rank, config); });
}

HETOBS_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  REAL_OR_FAIL(ncclCommInitAll, ncclResult_t (*)(ncclComm_t*, int, const int*));
  Process* p = (cudaRt() && comms && ndev > 0) ? startProcess(-1, -1) : nullptr;
  if (!p) return real(comms, ndev, devlist);
  // One communicator whose ranks all live in this process: one id for all of them.
  static std::atomic<uint64_t> calls{0};
  uint64_t key[2] = {uint64_t(getpid()), calls.fetch_add(1)};
  uint64_t id = commIdFrom(key, sizeof key, 0x1a11);
  std::vector<std::shared_ptr<NcclComm>> made;
  for (int i = 0; i < ndev; ++i) {
    made.push_back(makeComm(*p, id, i, ndev, devlist ? devlist[i] : i, false));
    noteUnbound(made.back());
  }
  ncclResult_t r = real(comms, ndev, devlist);
  if (r == ncclSuccess || r == ncclInProgress) {
    for (int i = 0; i < ndev; ++i) {
      if (!comms[i]) continue;
      attachComm(*made[size_t(i)]);
      addComm(comms[i], made[size_t(i)]);
    }
  }
  return r;
}

HETOBS_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                         ncclConfig_t* config) {
  REAL_OR_FAIL(ncclCommSplit, ncclResult_t (*)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*));
  std::shared_ptr<NcclComm> parent = commFor(comm);
  // Every member of the parent calls split in the same order: (parent id, split number,
  // color) names the child alike on all of its members.
  uint64_t childKey[3] = {parent ? parent->id() : 0, parent ? uint64_t(parent->splits.fetch_add(1)) : 0,
                          uint64_t(int64_t(color))};
  ncclResult_t r = real(comm, color, key, newcomm, config);
  if (!parent || r != ncclSuccess || !newcomm || !*newcomm) return r;  // (in progress: adopted on first use)
  auto count = HETOBS_REAL(ncclCommCount, ncclResult_t (*)(ncclComm_t, int*));
  auto userRank = HETOBS_REAL(ncclCommUserRank, ncclResult_t (*)(ncclComm_t, int*));
  int size = 0, rank = -1;
  Process* p = process();
  if (!p || !count || !userRank || count(*newcomm, &size) != ncclSuccess ||
      userRank(*newcomm, &rank) != ncclSuccess || size <= 0 || rank < 0 || rank >= size)
    return r;
  auto c = makeComm(*p, commIdFrom(childKey, sizeof childKey, 0x5b117), rank, size, parent->device());
  addComm(*newcomm, c);
  noteUnbound(c);
  return r;
}

HETOBS_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  REAL_OR_FAIL(ncclCommDestroy, ncclResult_t (*)(ncclComm_t));
  std::shared_ptr<NcclComm> c = findComm(comm);
  if (c) commClosed(*c, false);  // nobody calls into this comm from our threads any more
  ncclResult_t r = real(comm);
  if (c) removeComm(comm);  // its unfinished ops keep it alive until the poller ends them
  return r;
}

HETOBS_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  REAL_OR_FAIL(ncclCommAbort, ncclResult_t (*)(ncclComm_t));
  std::shared_ptr<NcclComm> c = findComm(comm);
  if (c) commClosed(*c, true);  // its unfinished ops end as failed
  ncclResult_t r = real(comm);
  if (c) removeComm(comm);
  return r;
}

// ------------------------------------------------------------------ groups

HETOBS_EXPORT ncclResult_t ncclGroupStart() {
  REAL_OR_FAIL(ncclGroupStart, ncclResult_t (*)());
  groupStarted();
  return real();
}

HETOBS_EXPORT ncclResult_t ncclGroupEnd() {
  REAL_OR_FAIL(ncclGroupEnd, ncclResult_t (*)());
  return groupEnd(real);
}

// ------------------------------------------------------------------ collectives and p2p

HETOBS_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(ncclAllReduce,
               ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t));
  return recorded(
      comm, stream, [&](uint64_t) { return makeOp(OpKind::kAllReduce, datatype, count, count, count, redopOf(op)); },
      [&] { return real(sendbuff, recvbuff, count, datatype, op, comm, stream); });
}

HETOBS_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(ncclAllGather, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
  return recorded(
      comm, stream,
      [&](uint64_t n) { return makeOp(OpKind::kAllGather, datatype, sendcount, sendcount * n, sendcount * n); },
      [&] { return real(sendbuff, recvbuff, sendcount, datatype, comm, stream); });
}

HETOBS_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream) {
  REAL_OR_FAIL(ncclReduceScatter,
               ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t));
  return recorded(
      comm, stream,
      [&](uint64_t n) {
        return makeOp(OpKind::kReduceScatter, datatype, recvcount * n, recvcount, recvcount * n, redopOf(op));
      },
      [&] { return real(sendbuff, recvbuff, recvcount, datatype, op, comm, stream); });
}

HETOBS_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         int root, ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(ncclBroadcast,
               ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  return recorded(
      comm, stream,
      [&](uint64_t) { return makeOp(OpKind::kBroadcast, datatype, count, count, count, RedOp::kSum, root); },
      [&] { return real(sendbuff, recvbuff, count, datatype, root, comm, stream); });
}

HETOBS_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  REAL_OR_FAIL(ncclBcast, ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  return recorded(
      comm, stream,
      [&](uint64_t) { return makeOp(OpKind::kBroadcast, datatype, count, count, count, RedOp::kSum, root); },
      [&] { return real(buff, count, datatype, root, comm, stream); });
}

HETOBS_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(ncclReduce, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                                            cudaStream_t));
  return recorded(
      comm, stream,
      [&](uint64_t) { return makeOp(OpKind::kReduce, datatype, count, count, count, redopOf(op), root); },
      [&] { return real(sendbuff, recvbuff, count, datatype, op, root, comm, stream); });
}

HETOBS_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclComm_t comm, cudaStream_t stream) {
  REAL_OR_FAIL(ncclSend, ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  return recorded(
      comm, stream, [&](uint64_t) { return makeOp(OpKind::kSend, datatype, count, 0, count, RedOp::kSum, peer); },
      [&] { return real(sendbuff, count, datatype, peer, comm, stream); });
}

HETOBS_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                    cudaStream_t stream) {
  REAL_OR_FAIL(ncclRecv, ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  return recorded(
      comm, stream, [&](uint64_t) { return makeOp(OpKind::kRecv, datatype, 0, count, count, RedOp::kSum, peer); },
      [&] { return real(recvbuff, count, datatype, peer, comm, stream); });
}
