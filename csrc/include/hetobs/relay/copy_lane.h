#pragma once
// One direction of staging copies (source -> send slot, or receive slot -> destination).
// Copies run in the order posted and complete in that order; the op thread polls for
// completion and never blocks on a copy unless it has nothing else to do.
//
// Two kinds: host memcpy on a copy thread (kHost: exercises and measures the pipeline
// without a device), and cudaMemcpyAsync on a non-blocking stream with an event per
// copy (kCuda). Both are made once per communicator and reused by every relay.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "hetobs/relay/relay.h"

namespace hetobs {

class CopyLane {
 public:
  virtual ~CopyLane() = default;
  // Called on the thread about to post copies (kCuda: makes the lane's device current).
  virtual void activate() {}
  // Make the copies posted from now on wait for the work queued so far on `stream` (the
  // caller's CUDA stream, which produced the sources), without blocking the host.
  virtual void orderAfter(void* stream) { (void)stream; }
  // Queue a copy; returns its ticket (1, 2, ... over the lane's life). Waits for room
  // when `capacity()` copies are outstanding.
  virtual uint64_t post(void* dst, const void* src, size_t n) = 0;
  // Tickets finished so far (every ticket <= this is done). Never blocks.
  virtual uint64_t completed() = 0;
  // Block until `ticket` is done or timeoutNs passed (then returns; poll completed()).
  virtual void waitFor(uint64_t ticket, int64_t timeoutNs) = 0;
  // Block until everything posted is done (after a failure: no copy may outlive the op).
  virtual void drain() = 0;
  // Time this lane spent copying, over its life.
  virtual int64_t busyNs() = 0;
  // Staging memory suited to this lane (page-aligned host memory; pinned for CUDA).
  virtual uint8_t* allocStaging(size_t bytes) = 0;
  virtual void freeStaging(uint8_t* p) = 0;
};

// `wake` runs on the copy thread after each copy (rings the op thread's doorbell).
std::unique_ptr<CopyLane> makeHostCopyLane(std::function<void()> wake);
// Throws Error naming what is missing when no usable CUDA runtime can be loaded.
std::unique_ptr<CopyLane> makeCudaCopyLane(int device);

}  // namespace hetobs
