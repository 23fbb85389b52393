// The MPI functions libhetobs_mpi.so defines over the standard PMPI profiling
// interface. Each one records the op in the watched communicator (begin before the
// PMPI call, end after it; nonblocking ops end in the Wait/Test call that completes
// them) and returns exactly what PMPI returned. A communicator that is not watched
// (the interposer is inert, an intercommunicator, one made by a constructor not
// wrapped here such as MPI_Cart_create) goes straight to PMPI.
//
// Record conventions (counts in elements of the recorder dtype; datatypes without a
// recorder dtype are counted in bytes as uint8):
//   all_reduce/reduce/broadcast: count; bytes = count x size.
//   all_gather: count = per-rank contribution, out_count = n x it, bytes = out_count x size.
//   MPI_Allgatherv, MPI_Reduce_scatter: count = the sum of recvcounts (the same on every
//     rank, so ops can be matched across ranks).
//   reduce_scatter (block): count = n x recvcount, out_count = recvcount.
//   all_to_all: count = n x sendcount.
//   gather/scatter: count = per-rank block, out_count = n x it.
//   MPI_Alltoallv, MPI_Gatherv, MPI_Scatterv: counts differ per rank, so count = 0 and
//     bytes = what this rank sends (gatherv root / scatterv root: the whole payload).
//   send/recv: peer = the rank in the communicator (-1 for MPI_ANY_SOURCE); ops on
//     MPI_PROC_NULL are not recorded. MPI_Sendrecv records a send and a recv.
#include <mpi.h>

#include <cstdlib>
#include <memory>
#include <new>

#include "state.h"

#define HETOBS_MPI_API extern "C" __attribute__((visibility("default")))

using hetobs::DType;
using hetobs::ExternalComm;
using hetobs::ExternalOp;
using hetobs::OpKind;
using hetobs::RedOp;
using namespace hetobs::mpi;

namespace {

inline uint64_t beginOp(ExternalComm* x, const ExternalOp& o) noexcept {
  try {
    return x->begin(o);
  } catch (...) {
    return 0;
  }
}

void endFailed(ExternalComm* x, uint64_t tok, int rc) noexcept {
  char msg[MPI_MAX_ERROR_STRING + 16] = "MPI error";
  int len = 0;
  if (PMPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
  try {
    x->end(tok, false, msg);
  } catch (...) {
  }
}

inline void endOp(ExternalComm* x, uint64_t tok, int rc) noexcept {
  if (__builtin_expect(rc == MPI_SUCCESS, 1)) {
    try {
      x->end(tok, true, nullptr);
    } catch (...) {
    }
  } else {
    endFailed(x, tok, rc);
  }
}

inline uint64_t sum(const int* counts, int n) {
  uint64_t s = 0;
  if (counts)
    for (int i = 0; i < n; ++i) s += counts[i] > 0 ? uint64_t(counts[i]) : 0;
  return s;
}

inline uint64_t u(int v) { return v > 0 ? uint64_t(v) : 0; }

// A tracked request completed (or was freed): end its op, or watch the communicator an
// MPI_Comm_idup made.
inline void finishRequest(const Pending& p, int rc, bool completed = true) noexcept {
  if (p.comm == kIdupRequest) finishIdup(p.token, completed && rc == MPI_SUCCESS);
  else endOp(p.comm, p.token, rc);
}

// A nonblocking op issued: remember its request, or end it now if the call failed.
inline int issued(ExternalComm* x, uint64_t tok, int rc, MPI_Request* req) {
  if (rc == MPI_SUCCESS && req) trackRequest(*req, x, tok);
  else endOp(x, tok, rc);
  return rc;
}

// Requests of a Wait*/Test* call, taken out of the table before the call. Small calls
// use the stack; large ones allocate (rare; MPI itself allocates there).
class Taken {
 public:
  Taken(int n, MPI_Request* reqs) {
    if (!gActive.load(std::memory_order_relaxed) || n <= 0 || !reqs) return;
    if (n > kInline) {
      heap_.reset(new (std::nothrow) Slot[size_t(n)]);
      if (!heap_) return;
      items_ = heap_.get();
    }
    for (int i = 0; i < n; ++i) {
      Pending p;
      if (takeRequest(reqs[i], &p)) items_[used_++] = Slot{i, p};
    }
  }
  // After the call: requests now MPI_REQUEST_NULL completed; the rest go back.
  void settle(MPI_Request* reqs, int rc) {
    for (int k = 0; k < used_; ++k) {
      const Slot& s = items_[k];
      if (reqs[s.index] == MPI_REQUEST_NULL) finishRequest(s.p, rc == MPI_ERR_IN_STATUS ? MPI_SUCCESS : rc);
      else untakeRequest(s.p);
    }
  }
  bool any() const { return used_ > 0; }

 private:
  struct Slot {
    int index;
    Pending p;
  };
  static constexpr int kInline = 32;
  Slot inline_[kInline];
  std::unique_ptr<Slot[]> heap_;
  Slot* items_ = inline_;
  int used_ = 0;
};

}  // namespace

// ---------------------------------------------------------------- init / finalize

HETOBS_MPI_API int MPI_Init(int* argc, char*** argv) {
  int rc = PMPI_Init(argc, argv);
  if (rc == MPI_SUCCESS) {
    try {
      setUp();
    } catch (...) {
    }
  }
  return rc;
}

HETOBS_MPI_API int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  int rc = PMPI_Init_thread(argc, argv, required, provided);
  if (rc == MPI_SUCCESS) {
    try {
      setUp();
    } catch (...) {
    }
  }
  return rc;
}

HETOBS_MPI_API int MPI_Finalize(void) {
  try {
    tearDown();
  } catch (...) {
  }
  return PMPI_Finalize();
}

// ---------------------------------------------------------------- collectives

HETOBS_MPI_API int MPI_Allreduce(const void* sb, void* rb, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Allreduce(sb, rb, count, t, op, comm);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kAllReduce, t, u(count), u(count), u(count), -1, redOpOf(op)));
  int rc = PMPI_Allreduce(sb, rb, count, t, op, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Reduce(const void* sb, void* rb, int count, MPI_Datatype t, MPI_Op op, int root,
                              MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Reduce(sb, rb, count, t, op, root, comm);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kReduce, t, u(count), u(count), u(count), root, redOpOf(op)));
  int rc = PMPI_Reduce(sb, rb, count, t, op, root, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Bcast(void* buf, int count, MPI_Datatype t, int root, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Bcast(buf, count, t, root, comm);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kBroadcast, t, u(count), u(count), u(count), root));
  int rc = PMPI_Bcast(buf, count, t, root, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Allgather(const void* sb, int scount, MPI_Datatype st, void* rb, int rcount,
                                 MPI_Datatype rt, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Allgather(sb, scount, st, rb, rcount, rt, comm);
  uint64_t n = uint64_t(c->x->size());
  uint64_t per = u(rcount);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kAllGather, rt, per, per * n, per * n, -1));
  int rc = PMPI_Allgather(sb, scount, st, rb, rcount, rt, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Allgatherv(const void* sb, int scount, MPI_Datatype st, void* rb, const int rcounts[],
                                  const int displs[], MPI_Datatype rt, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Allgatherv(sb, scount, st, rb, rcounts, displs, rt, comm);
  uint64_t total = sum(rcounts, c->x->size());
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kAllGather, rt, total, total, total, -1));
  int rc = PMPI_Allgatherv(sb, scount, st, rb, rcounts, displs, rt, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Reduce_scatter(const void* sb, void* rb, const int rcounts[], MPI_Datatype t, MPI_Op op,
                                      MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Reduce_scatter(sb, rb, rcounts, t, op, comm);
  uint64_t total = sum(rcounts, c->x->size());
  uint64_t mine = rcounts ? u(rcounts[c->x->rank()]) : 0;
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kReduceScatter, t, total, mine, total, -1, redOpOf(op)));
  int rc = PMPI_Reduce_scatter(sb, rb, rcounts, t, op, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Reduce_scatter_block(const void* sb, void* rb, int rcount, MPI_Datatype t, MPI_Op op,
                                            MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Reduce_scatter_block(sb, rb, rcount, t, op, comm);
  uint64_t total = u(rcount) * uint64_t(c->x->size());
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kReduceScatter, t, total, u(rcount), total, -1, redOpOf(op)));
  int rc = PMPI_Reduce_scatter_block(sb, rb, rcount, t, op, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Alltoall(const void* sb, int scount, MPI_Datatype st, void* rb, int rcount, MPI_Datatype rt,
                                MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Alltoall(sb, scount, st, rb, rcount, rt, comm);
  uint64_t n = uint64_t(c->x->size());
  bool inPlace = sb == MPI_IN_PLACE;
  uint64_t per = inPlace ? u(rcount) : u(scount);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kAllToAll, inPlace ? rt : st, per * n, u(rcount) * n, per * n, -1));
  int rc = PMPI_Alltoall(sb, scount, st, rb, rcount, rt, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Alltoallv(const void* sb, const int scounts[], const int sdispls[], MPI_Datatype st, void* rb,
                                 const int rcounts[], const int rdispls[], MPI_Datatype rt, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Alltoallv(sb, scounts, sdispls, st, rb, rcounts, rdispls, rt, comm);
  int n = c->x->size();
  bool inPlace = sb == MPI_IN_PLACE;
  uint64_t bytesCount = inPlace ? sum(rcounts, n) : sum(scounts, n);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kAllToAll, inPlace ? rt : st, 0, 0, bytesCount, -1));
  int rc = PMPI_Alltoallv(sb, scounts, sdispls, st, rb, rcounts, rdispls, rt, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Barrier(MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Barrier(comm);
  ExternalOp o;
  o.op = OpKind::kBarrier;
  o.dtype = DType::kUint8;
  uint64_t tok = beginOp(c->x, o);
  int rc = PMPI_Barrier(comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Gather(const void* sb, int scount, MPI_Datatype st, void* rb, int rcount, MPI_Datatype rt,
                              int root, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Gather(sb, scount, st, rb, rcount, rt, root, comm);
  uint64_t n = uint64_t(c->x->size());
  bool inPlace = sb == MPI_IN_PLACE;  // only at the root: its block is already in place
  uint64_t per = inPlace ? u(rcount) : u(scount);
  uint64_t tok = beginOp(c->x, makeOp(kGatherKind, inPlace ? rt : st, per, per * n, per * n, root));
  int rc = PMPI_Gather(sb, scount, st, rb, rcount, rt, root, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Gatherv(const void* sb, int scount, MPI_Datatype st, void* rb, const int rcounts[],
                               const int displs[], MPI_Datatype rt, int root, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Gatherv(sb, scount, st, rb, rcounts, displs, rt, root, comm);
  bool isRoot = c->x->rank() == root;
  uint64_t bytesCount = isRoot ? sum(rcounts, c->x->size()) : u(scount);
  uint64_t tok = beginOp(c->x, makeOp(kGatherKind, isRoot ? rt : st, 0, 0, bytesCount, root));
  int rc = PMPI_Gatherv(sb, scount, st, rb, rcounts, displs, rt, root, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Scatter(const void* sb, int scount, MPI_Datatype st, void* rb, int rcount, MPI_Datatype rt,
                               int root, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Scatter(sb, scount, st, rb, rcount, rt, root, comm);
  uint64_t n = uint64_t(c->x->size());
  bool inPlace = rb == MPI_IN_PLACE;  // only at the root
  uint64_t per = inPlace ? u(scount) : u(rcount);
  uint64_t tok = beginOp(c->x, makeOp(kScatterKind, inPlace ? st : rt, per, per * n, per * n, root));
  int rc = PMPI_Scatter(sb, scount, st, rb, rcount, rt, root, comm);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Scatterv(const void* sb, const int scounts[], const int displs[], MPI_Datatype st, void* rb,
                                int rcount, MPI_Datatype rt, int root, MPI_Comm comm) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Scatterv(sb, scounts, displs, st, rb, rcount, rt, root, comm);
  bool isRoot = c->x->rank() == root;
  uint64_t bytesCount = isRoot ? sum(scounts, c->x->size()) : u(rcount);
  uint64_t tok = beginOp(c->x, makeOp(kScatterKind, isRoot ? st : rt, 0, 0, bytesCount, root));
  int rc = PMPI_Scatterv(sb, scounts, displs, st, rb, rcount, rt, root, comm);
  endOp(c->x, tok, rc);
  return rc;
}

// ---------------------------------------------------------------- point to point

#define HETOBS_BLOCKING_SEND(NAME)                                                                    \
  HETOBS_MPI_API int MPI_##NAME(const void* buf, int count, MPI_Datatype t, int dest, int tag,        \
                                MPI_Comm comm) {                                                      \
    CommEntry* c = dest == MPI_PROC_NULL ? nullptr : commFor(comm);                                   \
    if (!c) return PMPI_##NAME(buf, count, t, dest, tag, comm);                                       \
    uint64_t tok = beginOp(c->x, makeOp(OpKind::kSend, t, u(count), u(count), u(count), dest));      \
    int rc = PMPI_##NAME(buf, count, t, dest, tag, comm);                                             \
    endOp(c->x, tok, rc);                                                                             \
    return rc;                                                                                        \
  }

HETOBS_BLOCKING_SEND(Send)
HETOBS_BLOCKING_SEND(Ssend)
HETOBS_BLOCKING_SEND(Rsend)
HETOBS_BLOCKING_SEND(Bsend)

HETOBS_MPI_API int MPI_Recv(void* buf, int count, MPI_Datatype t, int source, int tag, MPI_Comm comm,
                            MPI_Status* status) {
  CommEntry* c = source == MPI_PROC_NULL ? nullptr : commFor(comm);
  if (!c) return PMPI_Recv(buf, count, t, source, tag, comm, status);
  int peer = source == MPI_ANY_SOURCE ? -1 : source;
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kRecv, t, u(count), u(count), u(count), peer));
  int rc = PMPI_Recv(buf, count, t, source, tag, comm, status);
  endOp(c->x, tok, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Sendrecv(const void* sb, int scount, MPI_Datatype st, int dest, int stag, void* rb, int rcount,
                                MPI_Datatype rt, int source, int rtag, MPI_Comm comm, MPI_Status* status) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Sendrecv(sb, scount, st, dest, stag, rb, rcount, rt, source, rtag, comm, status);
  uint64_t ts = 0, tr = 0;
  if (dest != MPI_PROC_NULL) ts = beginOp(c->x, makeOp(OpKind::kSend, st, u(scount), u(scount), u(scount), dest));
  if (source != MPI_PROC_NULL)
    tr = beginOp(c->x, makeOp(OpKind::kRecv, rt, u(rcount), u(rcount), u(rcount),
                              source == MPI_ANY_SOURCE ? -1 : source));
  int rc = PMPI_Sendrecv(sb, scount, st, dest, stag, rb, rcount, rt, source, rtag, comm, status);
  if (ts) endOp(c->x, ts, rc);
  if (tr) endOp(c->x, tr, rc);
  return rc;
}

#define HETOBS_NONBLOCKING_SEND(NAME)                                                                 \
  HETOBS_MPI_API int MPI_##NAME(const void* buf, int count, MPI_Datatype t, int dest, int tag,        \
                                MPI_Comm comm, MPI_Request* req) {                                    \
    CommEntry* c = dest == MPI_PROC_NULL ? nullptr : commFor(comm);                                   \
    if (!c) return PMPI_##NAME(buf, count, t, dest, tag, comm, req);                                  \
    uint64_t tok = beginOp(c->x, makeOp(OpKind::kSend, t, u(count), u(count), u(count), dest));      \
    return issued(c->x, tok, PMPI_##NAME(buf, count, t, dest, tag, comm, req), req);                  \
  }

HETOBS_NONBLOCKING_SEND(Isend)
HETOBS_NONBLOCKING_SEND(Issend)

HETOBS_MPI_API int MPI_Irecv(void* buf, int count, MPI_Datatype t, int source, int tag, MPI_Comm comm,
                             MPI_Request* req) {
  CommEntry* c = source == MPI_PROC_NULL ? nullptr : commFor(comm);
  if (!c) return PMPI_Irecv(buf, count, t, source, tag, comm, req);
  int peer = source == MPI_ANY_SOURCE ? -1 : source;
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kRecv, t, u(count), u(count), u(count), peer));
  return issued(c->x, tok, PMPI_Irecv(buf, count, t, source, tag, comm, req), req);
}

// ---------------------------------------------------------------- nonblocking collectives

HETOBS_MPI_API int MPI_Iallreduce(const void* sb, void* rb, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                                  MPI_Request* req) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Iallreduce(sb, rb, count, t, op, comm, req);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kAllReduce, t, u(count), u(count), u(count), -1, redOpOf(op)));
  return issued(c->x, tok, PMPI_Iallreduce(sb, rb, count, t, op, comm, req), req);
}

HETOBS_MPI_API int MPI_Ireduce(const void* sb, void* rb, int count, MPI_Datatype t, MPI_Op op, int root,
                               MPI_Comm comm, MPI_Request* req) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Ireduce(sb, rb, count, t, op, root, comm, req);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kReduce, t, u(count), u(count), u(count), root, redOpOf(op)));
  return issued(c->x, tok, PMPI_Ireduce(sb, rb, count, t, op, root, comm, req), req);
}

HETOBS_MPI_API int MPI_Ibcast(void* buf, int count, MPI_Datatype t, int root, MPI_Comm comm, MPI_Request* req) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Ibcast(buf, count, t, root, comm, req);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kBroadcast, t, u(count), u(count), u(count), root));
  return issued(c->x, tok, PMPI_Ibcast(buf, count, t, root, comm, req), req);
}

HETOBS_MPI_API int MPI_Iallgather(const void* sb, int scount, MPI_Datatype st, void* rb, int rcount, MPI_Datatype rt,
                                  MPI_Comm comm, MPI_Request* req) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Iallgather(sb, scount, st, rb, rcount, rt, comm, req);
  uint64_t n = uint64_t(c->x->size()), per = u(rcount);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kAllGather, rt, per, per * n, per * n, -1));
  return issued(c->x, tok, PMPI_Iallgather(sb, scount, st, rb, rcount, rt, comm, req), req);
}

HETOBS_MPI_API int MPI_Ialltoall(const void* sb, int scount, MPI_Datatype st, void* rb, int rcount, MPI_Datatype rt,
                                 MPI_Comm comm, MPI_Request* req) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Ialltoall(sb, scount, st, rb, rcount, rt, comm, req);
  uint64_t n = uint64_t(c->x->size());
  bool inPlace = sb == MPI_IN_PLACE;
  uint64_t per = inPlace ? u(rcount) : u(scount);
  uint64_t tok = beginOp(c->x, makeOp(OpKind::kAllToAll, inPlace ? rt : st, per * n, u(rcount) * n, per * n, -1));
  return issued(c->x, tok, PMPI_Ialltoall(sb, scount, st, rb, rcount, rt, comm, req), req);
}

HETOBS_MPI_API int MPI_Ibarrier(MPI_Comm comm, MPI_Request* req) {
  CommEntry* c = commFor(comm);
  if (!c) return PMPI_Ibarrier(comm, req);
  ExternalOp o;
  o.op = OpKind::kBarrier;
  o.dtype = DType::kUint8;
  uint64_t tok = beginOp(c->x, o);
  return issued(c->x, tok, PMPI_Ibarrier(comm, req), req);
}

// ---------------------------------------------------------------- completion

HETOBS_MPI_API int MPI_Wait(MPI_Request* req, MPI_Status* status) {
  Pending p;
  bool tracked = req && gActive.load(std::memory_order_relaxed) && takeRequest(*req, &p);
  int rc = PMPI_Wait(req, status);
  if (tracked) {
    if (*req == MPI_REQUEST_NULL) finishRequest(p, rc);
    else untakeRequest(p);
  }
  return rc;
}

HETOBS_MPI_API int MPI_Test(MPI_Request* req, int* flag, MPI_Status* status) {
  Pending p;
  bool tracked = req && gActive.load(std::memory_order_relaxed) && takeRequest(*req, &p);
  int rc = PMPI_Test(req, flag, status);
  if (tracked) {
    if (*req == MPI_REQUEST_NULL) finishRequest(p, rc);
    else untakeRequest(p);
  }
  return rc;
}

HETOBS_MPI_API int MPI_Waitall(int count, MPI_Request reqs[], MPI_Status statuses[]) {
  Taken t(count, reqs);
  int rc = PMPI_Waitall(count, reqs, statuses);
  if (t.any()) t.settle(reqs, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Testall(int count, MPI_Request reqs[], int* flag, MPI_Status statuses[]) {
  Taken t(count, reqs);
  int rc = PMPI_Testall(count, reqs, flag, statuses);
  if (t.any()) t.settle(reqs, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Waitany(int count, MPI_Request reqs[], int* index, MPI_Status* status) {
  Taken t(count, reqs);
  int rc = PMPI_Waitany(count, reqs, index, status);
  if (t.any()) t.settle(reqs, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Testany(int count, MPI_Request reqs[], int* index, int* flag, MPI_Status* status) {
  Taken t(count, reqs);
  int rc = PMPI_Testany(count, reqs, index, flag, status);
  if (t.any()) t.settle(reqs, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Waitsome(int count, MPI_Request reqs[], int* outcount, int indices[], MPI_Status statuses[]) {
  Taken t(count, reqs);
  int rc = PMPI_Waitsome(count, reqs, outcount, indices, statuses);
  if (t.any()) t.settle(reqs, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Testsome(int count, MPI_Request reqs[], int* outcount, int indices[], MPI_Status statuses[]) {
  Taken t(count, reqs);
  int rc = PMPI_Testsome(count, reqs, outcount, indices, statuses);
  if (t.any()) t.settle(reqs, rc);
  return rc;
}

HETOBS_MPI_API int MPI_Request_free(MPI_Request* req) {
  Pending p;
  bool tracked = req && gActive.load(std::memory_order_relaxed) && takeRequest(*req, &p);
  int rc = PMPI_Request_free(req);
  // The op completes some time later, unseen: it is closed now so it is never taken for a hang.
  // (An MPI_Comm_idup freed this way makes a communicator this rank never learns is ready.)
  if (tracked) finishRequest(p, rc, /*completed=*/false);
  return rc;
}

// ---------------------------------------------------------------- communicators

HETOBS_MPI_API int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm) {
  int rc = PMPI_Comm_split(comm, color, key, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "split", color, true);
  return rc;
}

HETOBS_MPI_API int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm* newcomm) {
  int rc = PMPI_Comm_split_type(comm, type, key, info, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "split_type", type, true);
  return rc;
}

HETOBS_MPI_API int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) {
  int rc = PMPI_Comm_dup(comm, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "dup", 0, true);
  return rc;
}

HETOBS_MPI_API int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm* newcomm) {
  int rc = PMPI_Comm_create(comm, group, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "create", 0, true);
  return rc;
}

HETOBS_MPI_API int MPI_Comm_create_group(MPI_Comm comm, MPI_Group group, int tag, MPI_Comm* newcomm) {
  int rc = PMPI_Comm_create_group(comm, group, tag, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "create_group", tag, false);
  return rc;
}

HETOBS_MPI_API int MPI_Comm_dup_with_info(MPI_Comm comm, MPI_Info info, MPI_Comm* newcomm) {
  int rc = PMPI_Comm_dup_with_info(comm, info, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "dup_with_info", 0, true);
  return rc;
}

// Virtual topologies are communicators like any other: collectives on them are watched.
// (Ranks left out of a Cart_create get MPI_COMM_NULL and still count the child.)
HETOBS_MPI_API int MPI_Cart_create(MPI_Comm comm, int ndims, const int dims[], const int periods[], int reorder,
                                   MPI_Comm* newcomm) {
  int rc = PMPI_Cart_create(comm, ndims, dims, periods, reorder, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "cart_create", ndims, true);
  return rc;
}

HETOBS_MPI_API int MPI_Cart_sub(MPI_Comm comm, const int remain_dims[], MPI_Comm* newcomm) {
  int rc = PMPI_Cart_sub(comm, remain_dims, newcomm);
  // Siblings (one per slice) are told apart by their members.
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "cart_sub", 0, true);
  return rc;
}

HETOBS_MPI_API int MPI_Graph_create(MPI_Comm comm, int nnodes, const int index[], const int edges[], int reorder,
                                    MPI_Comm* newcomm) {
  int rc = PMPI_Graph_create(comm, nnodes, index, edges, reorder, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "graph_create", nnodes, true);
  return rc;
}

HETOBS_MPI_API int MPI_Dist_graph_create_adjacent(MPI_Comm comm, int indegree, const int sources[],
                                                  const int sourceweights[], int outdegree, const int destinations[],
                                                  const int destweights[], MPI_Info info, int reorder,
                                                  MPI_Comm* newcomm) {
  int rc = PMPI_Dist_graph_create_adjacent(comm, indegree, sources, sourceweights, outdegree, destinations,
                                           destweights, info, reorder, newcomm);
  // The degrees differ per rank, so they cannot go into the id every member must agree on.
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "dist_graph_create_adjacent", 0, true);
  return rc;
}

HETOBS_MPI_API int MPI_Dist_graph_create(MPI_Comm comm, int n, const int sources[], const int degrees[],
                                         const int destinations[], const int weights[], MPI_Info info, int reorder,
                                         MPI_Comm* newcomm) {
  int rc = PMPI_Dist_graph_create(comm, n, sources, degrees, destinations, weights, info, reorder, newcomm);
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(comm, *newcomm, "dist_graph_create", 0, true);
  return rc;
}

HETOBS_MPI_API int MPI_Comm_idup(MPI_Comm comm, MPI_Comm* newcomm, MPI_Request* request) {
  uint64_t token = gActive.load(std::memory_order_relaxed) ? parkIdup(comm, newcomm) : 0;
  int rc = PMPI_Comm_idup(comm, newcomm, request);
  if (token == 0) return rc;
  if (rc == MPI_SUCCESS && request) trackRequest(*request, kIdupRequest, token);
  else finishIdup(token, false);
  return rc;
}

HETOBS_MPI_API int MPI_Intercomm_merge(MPI_Comm intercomm, int high, MPI_Comm* newcomm) {
  int rc = PMPI_Intercomm_merge(intercomm, high, newcomm);
  // The intercommunicator itself is not watched, so the merged one is derived from the
  // world and counted per member set (`high` differs between the two sides: not in the id).
  if (rc == MPI_SUCCESS && newcomm && gActive.load(std::memory_order_relaxed))
    onCommCreated(MPI_COMM_WORLD, *newcomm, "intercomm_merge", 0, false);
  return rc;
}

HETOBS_MPI_API int MPI_Comm_free(MPI_Comm* comm) {
  if (comm && gActive.load(std::memory_order_relaxed)) {
    try {
      onCommFree(*comm);
    } catch (...) {
    }
  }
  return PMPI_Comm_free(comm);
}
