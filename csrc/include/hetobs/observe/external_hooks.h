#pragma once
// What a vendor wrapper tells the recorder about one op, and the C table through which a
// separately built extension (hetobs._torch_ext, compiled against torch) reaches the
// ExternalComm of hetobs._core. The table, not a second link of the core: one process
// must have one recorder, one stats segment and one watchdog.
#include <cstdint>

#include "hetobs/common/wire.h"

namespace hetobs {

struct ExternalOp {
  OpKind op = OpKind::kAllReduce;
  DType dtype = DType::kFloat32;
  RedOp redop = RedOp::kSum;
  int root_or_peer = -1;
  uint64_t count = 0;
  uint64_t out_count = 0;
  uint64_t bytes = 0;
  int64_t enqueue_ns = 0;  // monotonic; 0 = now
};

// Bump when a field or a signature below changes; the extension refuses another version.
constexpr uint32_t kExternalHooksAbi = 2;
// Name of the PyCapsule that ExternalComm._hooks() returns (pointer: ExternalHandle).
constexpr const char* kExternalHooksCapsule = "hetobs.external_hooks";

struct ExternalHooks {
  uint32_t abi;
  // `comm` is an opaque reference taken with retain() and given back with release().
  uint64_t (*begin)(void* comm, const ExternalOp* op);
  void (*end)(void* comm, uint64_t token, bool ok, const char* error);
  void* (*retain)(void* comm);
  void (*release)(void* comm);
  // Result digests of the library's collectives (HETOBS_DIGEST, ExternalComm::digestDue and
  // checkResult). digest_due: whether op `token` is checked once complete (false at once
  // when digests are off). check_result: `count` elements of `es` bytes at `data`, compared
  // across ranks through `gather` (every rank's `bytes` at all + rank * bytes; returns 0, or
  // nonzero when the library's exchange failed). Returns ExternalComm::kDigest*, or -1 when
  // the check itself failed; `msg` (NUL-terminated, cut to msg_cap) says what to tell the job.
  bool (*digest_due)(void* comm, uint64_t token);
  int (*check_result)(void* comm, uint64_t token, uint8_t* data, uint64_t count, uint32_t es,
                      int (*gather)(void* ctx, const uint8_t* mine, uint64_t bytes, uint8_t* all), void* ctx,
                      char* msg, uint64_t msg_cap);
};

// What the capsule points at: the table and one reference, valid while the capsule lives.
struct ExternalHandle {
  const ExternalHooks* hooks;
  void* comm;
};

}  // namespace hetobs
