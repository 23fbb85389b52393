// One direction of the relay's staging copies on any torch device, with no per-vendor
// code: a stream of the lane's own from the device's pool, a non_blocking copy of
// at::from_blob views between device memory and the device's pinned host staging under
// a c10::StreamGuard (which also restores the calling thread's current device and stream),
// one c10::Event per copy. A watcher thread waits on the oldest outstanding event and
// wakes the relay's op thread when it completes, so the op thread sleeps instead of
// polling. Whatever the vendor's driver does underneath (CUDA, Ascend's ACL, the
// stand-in's copy engines) is reached through the DeviceGuardImpl torch dispatches to.
#include "device_lane.h"

#include <ATen/Context.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace hetobs::torch_ext {
namespace {

constexpr uint64_t kRing = 64;  // copies outstanding at most (events are reused round the ring)

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void setErr(char* err, size_t len, const char* what) {
  if (!err || !len) return;
  std::strncpy(err, what, len - 1);
  err[len - 1] = 0;
}

class Lane {
 public:
  Lane(c10::Device device, bool toDevice, void (*wake)(void*), void* ctx)
      : device_(device), toDevice_(toDevice), wake_(wake), ctx_(ctx),
        stream_(c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, false)) {
    events_.reserve(kRing);
    for (uint64_t i = 0; i < kRing; ++i) events_.emplace_back(device.type());
    watcher_ = std::thread([this] { watch(); });
  }
  ~Lane() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    watcher_.join();
    for (auto& [p, dp] : staging_) dp.clear();
  }

  void orderAfter(int64_t streamId) {
    c10::Stream caller = c10::Stream::unpack3(streamId, device_.index(), device_.type());
    c10::Event marker(device_.type());
    marker.record(caller);
    marker.block(stream_);  // a device-side wait: the host goes on
  }

  uint64_t post(void* dst, const void* src, size_t n) {
    uint64_t t;
    {
      std::unique_lock<std::mutex> g(m_);
      cv_.wait(g, [&] { return posted_ - done_ < kRing || !error_.empty(); });
      if (!error_.empty()) throw std::runtime_error(error_);
      t = posted_ + 1;
    }
    {
      c10::StreamGuard on(stream_);
      if (n) {
        auto bytes = at::TensorOptions().dtype(at::kByte);
        void* devPtr = toDevice_ ? dst : const_cast<void*>(src);
        void* hostPtr = toDevice_ ? const_cast<void*>(src) : dst;
        at::Tensor dev = at::from_blob(devPtr, {int64_t(n)}, bytes.device(device_));
        at::Tensor host = at::from_blob(hostPtr, {int64_t(n)}, bytes);
        if (toDevice_)
          dev.copy_(host, /*non_blocking=*/true);
        else
          host.copy_(dev, /*non_blocking=*/true);
      }
      events_[t % kRing].record(stream_);
    }
    {
      std::lock_guard<std::mutex> g(m_);
      if (posted_ == done_) busyFrom_ = nowNs();
      posted_ = t;
    }
    cv_.notify_all();
    return t;
  }

  uint64_t completed() {
    std::lock_guard<std::mutex> g(m_);
    return done_;
  }

  void waitFor(uint64_t ticket, int64_t timeoutNs) {
    std::unique_lock<std::mutex> g(m_);
    cv_.wait_for(g, std::chrono::nanoseconds(timeoutNs), [&] { return done_ >= ticket || !error_.empty(); });
  }

  void drain() {
    std::unique_lock<std::mutex> g(m_);
    cv_.wait(g, [&] { return done_ >= posted_ || !error_.empty(); });
    if (!error_.empty()) throw std::runtime_error(error_);
  }

  int64_t busyNs() {
    std::lock_guard<std::mutex> g(m_);
    return busy_ + (posted_ > done_ ? nowNs() - busyFrom_ : 0);
  }

  void* allocStaging(size_t bytes) {
    at::Allocator* a = pinnedAllocator();
    c10::DataPtr dp = a->allocate(bytes ? bytes : 1);
    void* p = dp.get();
    std::lock_guard<std::mutex> g(m_);
    staging_.emplace(p, std::move(dp));
    return p;
  }

  void freeStaging(void* p) {
    c10::DataPtr dp;
    {
      std::lock_guard<std::mutex> g(m_);
      auto it = staging_.find(p);
      if (it == staging_.end()) return;
      dp = std::move(it->second);
      staging_.erase(it);
    }
  }

 private:
  // The device's pinned host memory (what makes its copies asynchronous); a device without
  // one gets pageable memory, and its copies are then synchronous: correct, not overlapped.
  at::Allocator* pinnedAllocator() {
    try {
      return at::globalContext().getPinnedMemoryAllocator(device_.type());
    } catch (const c10::Error&) {
      TORCH_WARN_ONCE("hetobs relay: ", device_.type(), " has no pinned host allocator; staging in pageable memory "
                      "(copies will not overlap the wire)");
      return c10::GetCPUAllocator();
    }
  }

  void watch() {
    for (;;) {
      uint64_t t;
      {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [&] { return stop_ || watched_ < posted_; });
        if (watched_ >= posted_) return;  // stopping, nothing outstanding
        t = watched_ + 1;
      }
      std::string failure;
      try {
        events_[t % kRing].synchronize();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      {
        std::lock_guard<std::mutex> g(m_);
        watched_ = done_ = t;
        if (!failure.empty() && error_.empty()) error_ = "a device copy failed: " + failure;
        if (done_ == posted_) busy_ += nowNs() - busyFrom_;
      }
      cv_.notify_all();
      if (wake_) wake_(ctx_);
    }
  }

  c10::Device device_;
  bool toDevice_;
  void (*wake_)(void*);
  void* ctx_;
  c10::Stream stream_;
  std::vector<c10::Event> events_;
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t posted_ = 0, done_ = 0, watched_ = 0;
  int64_t busy_ = 0, busyFrom_ = 0;
  std::string error_;
  bool stop_ = false;
  std::unordered_map<void*, c10::DataPtr> staging_;
  std::thread watcher_;
};

template <class F>
int guarded(char* err, size_t len, F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    setErr(err, len, e.what_without_backtrace());
  } catch (const std::exception& e) {
    setErr(err, len, e.what());
  }
  return 1;
}

Lane* L(void* lane) { return static_cast<Lane*>(lane); }

const DeviceLaneHooks kHooks = {
    kDeviceLaneHooksAbi,
    [](int type, int index, int toDevice, void (*wake)(void*), void* ctx, char* err, size_t len) -> void* {
      Lane* lane = nullptr;
      guarded(err, len, [&] {
        auto t = static_cast<c10::DeviceType>(type);
        TORCH_CHECK(c10::isValidDeviceType(t), "device type code ", type, " is not one torch knows");
        lane = new Lane(c10::Device(t, c10::DeviceIndex(index)), toDevice != 0, wake, ctx);
      });
      return lane;
    },
    [](void* lane) { delete L(lane); },
    [](void* lane, int64_t streamId, char* err, size_t len) {
      return guarded(err, len, [&] { L(lane)->orderAfter(streamId); });
    },
    [](void* lane, void* dst, const void* src, size_t n, uint64_t* ticket, char* err, size_t len) {
      return guarded(err, len, [&] { *ticket = L(lane)->post(dst, src, n); });
    },
    [](void* lane) { return L(lane)->completed(); },
    [](void* lane, uint64_t ticket, int64_t timeoutNs) { L(lane)->waitFor(ticket, timeoutNs); },
    [](void* lane, char* err, size_t len) { return guarded(err, len, [&] { L(lane)->drain(); }); },
    [](void* lane) { return L(lane)->busyNs(); },
    [](void* lane, size_t bytes, char* err, size_t len) -> void* {
      void* p = nullptr;
      guarded(err, len, [&] { p = L(lane)->allocStaging(bytes); });
      return p;
    },
    [](void* lane, void* p) { L(lane)->freeStaging(p); },
    [](int type, char* out, size_t len) {
      return guarded(out, len, [&] {
        auto t = static_cast<c10::DeviceType>(type);
        TORCH_CHECK(c10::isValidDeviceType(t), "unknown device type ", type);
        setErr(out, len, c10::DeviceTypeName(t, /*lower_case=*/true).c_str());
      });
    },
};

}  // namespace

const DeviceLaneHooks* deviceLaneHooks() { return &kHooks; }

}  // namespace hetobs::torch_ext
