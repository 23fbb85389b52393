#pragma once
// State of the PMPI interposer (libhetobs_mpi.so): which MPI communicators are
// watched, which nonblocking requests are in flight, and how MPI datatypes and
// reduction ops map onto the recorder's vocabulary.
//
// Hot path (every wrapped MPI call): one relaxed load of `active`, a comparison with
// MPI_COMM_WORLD (or a probe of a fixed open-addressing table for other
// communicators), a scan of a short table of predefined datatypes, then
// ExternalComm::begin/end. No locks, no allocation. Communicator creation and
// MPI_Init/MPI_Finalize take a mutex; they are rare.
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "hetobs/common/wire.h"
#include "hetobs/observe/external_comm.h"

namespace hetobs {
namespace mpi {

// One watched communicator.
struct CommEntry {
  std::shared_ptr<ExternalComm> ext;
  ExternalComm* x = nullptr;  // ext.get(), read on the hot path
  uint64_t id = 0;
  std::atomic<uint64_t> children{0};  // communicators created from this one (ids of children derive from it)
};

// MPI handles are pointers (Open MPI) or ints (MPICH): key them by their bits.
template <class H>
inline uint64_t handleKey(H h) {
  uint64_t k = 0;
  static_assert(sizeof(H) <= sizeof(k), "MPI handle wider than 64 bits");
  std::memcpy(&k, &h, sizeof(H));
  return k;
}

inline uint64_t mixKey(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

// Process-wide flag: true between a successful set-up in MPI_Init and MPI_Finalize.
extern std::atomic<bool> gActive;
extern CommEntry* gWorld;

// --- communicators ---------------------------------------------------------------
// Lock-free lookup (readers), writers serialized by the creation mutex. Keys are never
// removed (a freed handle's value is cleared; MPI reuses handle values).
CommEntry* findComm(uint64_t key);

inline CommEntry* commFor(MPI_Comm c) {
  if (!gActive.load(std::memory_order_relaxed)) return nullptr;
  if (c == MPI_COMM_WORLD) return gWorld;
  return findComm(handleKey(c));
}

// After a successful communicator constructor: derive the child's id and watch it.
// `kind` names the constructor; `salt` separates siblings made by the same call (color).
void onCommCreated(MPI_Comm parent, MPI_Comm child, const char* kind, int64_t salt, bool collectiveOnParent);
// Before MPI_Comm_free: stop watching (the entry stays alive while ops are in flight).
void onCommFree(MPI_Comm c);
// MPI_Comm_idup: the new communicator exists only once its request completes. The call
// takes the child's place under the parent and parks `out`; the request is tracked with
// kIdupRequest as its "communicator" and the returned token (0: not watched), and its
// completion calls finishIdup (created: the request completed successfully).
extern ExternalComm* const kIdupRequest;
uint64_t parkIdup(MPI_Comm parent, MPI_Comm* out);
void finishIdup(uint64_t token, bool created);

// --- nonblocking requests ----------------------------------------------------------
struct Pending {
  uint64_t key = 0;       // the request handle's bits (0: none)
  uint64_t token = 0;     // ExternalComm token
  ExternalComm* comm = nullptr;
};

// Remember that `req` completes the op `token` of `comm`. If the table is full the op is
// ended now (it stays recorded, with its issue time as completion).
void trackRequest(MPI_Request req, ExternalComm* comm, uint64_t token);
// Take the entry of `req` out of the table (before the MPI call that may complete it, so a
// handle value MPI reuses on another thread cannot be confused). false: not tracked.
bool takeRequest(MPI_Request req, Pending* out);
// Put back an entry taken before a test that did not complete it.
void untakeRequest(const Pending& p);

// --- vocabulary -----------------------------------------------------------------
struct TypeInfo {
  DType dtype;
  uint64_t size;  // bytes per element of the MPI datatype
  bool native;    // maps onto a recorder dtype; else counted in bytes as uint8
};
TypeInfo typeInfo(MPI_Datatype t);
RedOp redOpOf(MPI_Op op);

// An op description: counts in the datatype's elements, converted to recorder units.
inline ExternalOp makeOp(OpKind kind, MPI_Datatype t, uint64_t count, uint64_t outCount, uint64_t bytesCount,
                         int rootOrPeer, RedOp redop = RedOp::kSum) {
  TypeInfo ti = typeInfo(t);
  ExternalOp o;
  o.op = kind;
  o.redop = redop;
  o.root_or_peer = rootOrPeer;
  o.bytes = bytesCount * ti.size;
  if (ti.native) {
    o.dtype = ti.dtype;
    o.count = count;
    o.out_count = outCount;
  } else {
    o.dtype = DType::kUint8;
    o.count = count * ti.size;
    o.out_count = outCount * ti.size;
  }
  return o;
}

// Op kinds the recorder may not have yet: gather/scatter are appended after kRecv when
// the core knows them; until then they are recorded as all_gather / all_to_all.
constexpr OpKind kGatherKind = uint8_t(OpKind::kCount) > 10 ? OpKind(9) : OpKind::kAllGather;
constexpr OpKind kScatterKind = uint8_t(OpKind::kCount) > 10 ? OpKind(10) : OpKind::kAllToAll;

// --- set-up ---------------------------------------------------------------------
// Called right after a successful PMPI_Init/PMPI_Init_thread. Never throws; on any
// problem it logs one line and leaves the interposer inert (every rank agrees).
void setUp();
// Called before PMPI_Finalize.
void tearDown();

}  // namespace mpi
}  // namespace hetobs
