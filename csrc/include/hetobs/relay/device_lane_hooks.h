#pragma once
// The C table through which the relay copies to and from any torch device (stage kDevice).
//
// The core links no torch. hetobs._torch_ext (built against torch) implements these with
// torch's device-generic API (c10::Stream / c10::Event through the device's guard, copies
// of at::from_blob views with non_blocking=true, the device's pinned host allocator), so
// every device type that registers itself with torch the way vendors do (PrivateUse1
// devices such as Ascend's npu, in-tree ones such as xpu or cuda) is served by one lane
// with no per-vendor code. Python hands the table to the core once
// (_core.set_device_lane_hooks), as a capsule named kDeviceLaneHooksCapsule.
//
// Every function is noexcept at the boundary: failures return non-zero (or null) and write
// a message into `err` (at most errLen bytes, NUL-terminated).
#include <cstddef>
#include <cstdint>

namespace hetobs {

constexpr uint32_t kDeviceLaneHooksAbi = 1;
constexpr const char* kDeviceLaneHooksCapsule = "hetobs.DeviceLaneHooks";

struct DeviceLaneHooks {
  uint32_t abi;  // kDeviceLaneHooksAbi
  // A copy lane on a stream of its own on (deviceType, deviceIndex); toDevice: 1 copies
  // host -> device (the receive side), 0 device -> host (the send side). `wake(wakeCtx)`
  // runs on a thread of the lane after each copy completes.
  void* (*open)(int deviceType, int deviceIndex, int toDevice, void (*wake)(void*), void* wakeCtx, char* err,
                size_t errLen);
  void (*close)(void* lane);
  // Copies posted from now on start after the work queued so far on the caller's stream
  // `streamId` (a device-side wait: the host does not block).
  int (*order_after)(void* lane, int64_t streamId, char* err, size_t errLen);
  // Queue one copy of n bytes; *ticket: 1, 2, ... in order. Waits for room when full.
  int (*post)(void* lane, void* dst, const void* src, size_t n, uint64_t* ticket, char* err, size_t errLen);
  uint64_t (*completed)(void* lane);  // tickets done so far; never blocks
  void (*wait_for)(void* lane, uint64_t ticket, int64_t timeoutNs);
  int (*drain)(void* lane, char* err, size_t errLen);  // wait for everything posted
  int64_t (*busy_ns)(void* lane);                      // time with a copy outstanding, over the lane's life
  void* (*alloc_staging)(void* lane, size_t bytes, char* err, size_t errLen);  // the device's pinned memory
  void (*free_staging)(void* lane, void* p);
  // torch's name of a device type ("cuda", "npu", the renamed PrivateUse1 "standin", ...).
  int (*device_name)(int deviceType, char* out, size_t outLen);
};

// Set once by Python; null until then (kDevice then fails with an error saying why).
void setDeviceLaneHooks(const DeviceLaneHooks* hooks);
const DeviceLaneHooks* deviceLaneHooks();

}  // namespace hetobs
