// Stage kDevice: a CopyLane over the device-generic hooks hetobs._torch_ext registers
// (relay/device_lane_hooks.h). The lane's own thread wakes the op thread after each copy,
// so the relay sleeps on its doorbell as it does with host lanes.
#include <atomic>
#include <string>

#include "hetobs/common/error.h"
#include "hetobs/relay/copy_lane.h"
#include "hetobs/relay/device_lane_hooks.h"

namespace hetobs {
namespace {

std::atomic<const DeviceLaneHooks*> g_hooks{nullptr};

class DeviceCopyLane final : public CopyLane {
 public:
  DeviceCopyLane(const DeviceLaneHooks& h, int type, int index, bool toDevice, std::function<void()> wake)
      : h_(h), wake_(std::move(wake)) {
    char err[512] = {};
    lane_ = h_.open(type, index, toDevice ? 1 : 0, &DeviceCopyLane::ring, this, err, sizeof err);
    if (!lane_) throw Error(std::string("relay stage 'device': ") + err);
  }
  ~DeviceCopyLane() override {
    char err[512];
    h_.drain(lane_, err, sizeof err);  // nothing may copy into freed staging
    h_.close(lane_);
  }

  void orderAfter(void* stream) override {
    char err[512] = {};
    if (h_.order_after(lane_, int64_t(reinterpret_cast<intptr_t>(stream)), err, sizeof err) != 0) fail(err);
  }
  uint64_t post(void* dst, const void* src, size_t n) override {
    char err[512] = {};
    uint64_t t = 0;
    if (h_.post(lane_, dst, src, n, &t, err, sizeof err) != 0) fail(err);
    return t;
  }
  uint64_t completed() override { return h_.completed(lane_); }
  void waitFor(uint64_t ticket, int64_t timeoutNs) override { h_.wait_for(lane_, ticket, timeoutNs); }
  void drain() override {
    char err[512] = {};
    if (h_.drain(lane_, err, sizeof err) != 0) fail(err);
  }
  int64_t busyNs() override { return h_.busy_ns(lane_); }
  uint8_t* allocStaging(size_t bytes) override {
    char err[512] = {};
    void* p = h_.alloc_staging(lane_, bytes, err, sizeof err);
    if (!p) fail(err);
    return static_cast<uint8_t*>(p);
  }
  void freeStaging(uint8_t* p) override { h_.free_staging(lane_, p); }

 private:
  static void ring(void* self) {
    auto* l = static_cast<DeviceCopyLane*>(self);
    if (l->wake_) l->wake_();
  }
  [[noreturn]] static void fail(const char* err) { throw Error(std::string("relay stage 'device': ") + err); }

  const DeviceLaneHooks& h_;
  std::function<void()> wake_;
  void* lane_ = nullptr;
};

}  // namespace

void setDeviceLaneHooks(const DeviceLaneHooks* hooks) { g_hooks.store(hooks, std::memory_order_release); }
const DeviceLaneHooks* deviceLaneHooks() { return g_hooks.load(std::memory_order_acquire); }

std::unique_ptr<CopyLane> makeDeviceCopyLane(int deviceType, int deviceIndex, bool toDevice,
                                             std::function<void()> wake) {
  const DeviceLaneHooks* h = deviceLaneHooks();
  if (!h)
    throw Error("relay stage 'device' needs hetobs._torch_ext (the torch extension built with hetobs) to copy to "
                "and from the device; it is not loaded here");
  return std::make_unique<DeviceCopyLane>(*h, deviceType, deviceIndex, toDevice, std::move(wake));
}

std::string deviceTypeNameOf(int deviceType) {
  const DeviceLaneHooks* h = deviceLaneHooks();
  char name[64] = {};
  if (h && h->device_name(deviceType, name, sizeof name) == 0) return name;
  return "device" + std::to_string(deviceType);
}

}  // namespace hetobs
