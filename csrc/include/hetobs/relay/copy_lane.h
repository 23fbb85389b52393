#pragma once
// One direction of staging copies (source -> send slot, or receive slot -> destination).
// Copies run in the order posted and complete in that order; the op thread polls for
// completion and never blocks on a copy unless it has nothing else to do.
//
// Three kinds: host memcpy on a copy thread (kHost: exercises and measures the pipeline
// without a device), cudaMemcpyAsync on a non-blocking stream with an event per copy
// (kCuda: the CUDA fast path, no torch involved), and any torch device through torch's
// device-generic API (kDevice). All are made once per communicator and reused by every relay.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "hetobs/relay/relay.h"

namespace hetobs {

class CopyLane {
 public:
  virtual ~CopyLane() = default;
  // Make the copies posted from now on wait for the work queued so far on `stream` (the
  // caller's stream, which produced the sources: a cudaStream_t for kCuda, a c10 stream id
  // for kDevice), without blocking the host. Copies never change the calling thread's
  // current device: lanes switch it for the call and restore it.
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
// Any torch device type, through the hooks hetobs._torch_ext registers (device_lane_hooks.h);
// throws Error when they are not registered. `wake` runs after each copy completes.
std::unique_ptr<CopyLane> makeDeviceCopyLane(int deviceType, int deviceIndex, bool toDevice,
                                             std::function<void()> wake);
// torch's name of a device type code ("npu", "standin", ...), through the same hooks.
std::string deviceTypeNameOf(int deviceType);

}  // namespace hetobs
