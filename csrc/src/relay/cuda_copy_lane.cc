// Device staging copies: cudaMemcpyAsync on a non-blocking stream of our own (so the
// copies never wait behind, or hold up, the application's default stream), one event
// per copy, completion by cudaEventQuery. Never a device-wide synchronisation. The
// CUDA runtime is dlopen'ed (common/cuda_loader.h): the core does not link CUDA.
#include <dlfcn.h>
#include <sched.h>

#include <mutex>
#include <string>

#include "hetobs/common/clock.h"
#include "hetobs/common/cuda_loader.h"
#include "hetobs/relay/copy_lane.h"

namespace hetobs {
namespace {

using cudaError_t = int;
using cudaStream_t = void*;
using cudaEvent_t = void*;
constexpr cudaError_t kSuccess = 0;
constexpr cudaError_t kNotReady = 600;
constexpr unsigned kStreamNonBlocking = 0x01;
constexpr unsigned kEventDisableTiming = 0x02;
constexpr int kMemcpyDefault = 4;  // direction from the pointers (unified addressing)
constexpr size_t kEvents = 64;     // copies outstanding at most

struct CudaApi {
  cudaError_t (*setDevice)(int);
  cudaError_t (*getDevice)(int*);
  cudaError_t (*streamCreateWithFlags)(cudaStream_t*, unsigned);
  cudaError_t (*streamDestroy)(cudaStream_t);
  cudaError_t (*streamSynchronize)(cudaStream_t);
  cudaError_t (*memcpyAsync)(void*, const void*, size_t, int, cudaStream_t);
  cudaError_t (*eventCreateWithFlags)(cudaEvent_t*, unsigned);
  cudaError_t (*eventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*eventQuery)(cudaEvent_t);
  cudaError_t (*eventSynchronize)(cudaEvent_t);
  cudaError_t (*eventDestroy)(cudaEvent_t);
  cudaError_t (*streamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned);
  cudaError_t (*hostAlloc)(void**, size_t, unsigned);
  cudaError_t (*freeHost)(void*);
  cudaError_t (*getLastError)();
  const char* (*getErrorString)(cudaError_t);
  std::string path;
};

template <class F>
bool sym(void* lib, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (!*out && missing->empty()) *missing = name;
  return *out != nullptr;
}

// Loaded once; throws (every time) when there is no usable runtime.
const CudaApi& cudaApi() {
  static std::once_flag once;
  static CudaApi* api = nullptr;
  static std::string why;
  std::call_once(once, [] {
    std::string used;
    void* lib = openCudaRuntime(&used);
    if (!lib) {
      why = "relay stage 'cuda': no CUDA runtime (libcudart.so) could be loaded";
      return;
    }
    auto* a = new CudaApi();  // leaked: streams and pinned memory may be freed during exit
    std::string missing;
    bool ok = sym(lib, "cudaSetDevice", &a->setDevice, &missing) & sym(lib, "cudaGetDevice", &a->getDevice, &missing) &
              sym(lib, "cudaStreamCreateWithFlags", &a->streamCreateWithFlags, &missing) &
              sym(lib, "cudaStreamDestroy", &a->streamDestroy, &missing) &
              sym(lib, "cudaStreamSynchronize", &a->streamSynchronize, &missing) &
              sym(lib, "cudaMemcpyAsync", &a->memcpyAsync, &missing) &
              sym(lib, "cudaEventCreateWithFlags", &a->eventCreateWithFlags, &missing) &
              sym(lib, "cudaEventRecord", &a->eventRecord, &missing) &
              sym(lib, "cudaEventQuery", &a->eventQuery, &missing) &
              sym(lib, "cudaEventSynchronize", &a->eventSynchronize, &missing) &
              sym(lib, "cudaEventDestroy", &a->eventDestroy, &missing) &
              sym(lib, "cudaStreamWaitEvent", &a->streamWaitEvent, &missing) &
              sym(lib, "cudaHostAlloc", &a->hostAlloc, &missing) & sym(lib, "cudaFreeHost", &a->freeHost, &missing) &
              sym(lib, "cudaGetLastError", &a->getLastError, &missing) &
              sym(lib, "cudaGetErrorString", &a->getErrorString, &missing);
    if (!ok) {
      why = "relay stage 'cuda': " + used + " has no " + missing;
      delete a;
      return;
    }
    a->path = used;
    api = a;
  });
  if (!api) throw Error(why);
  return *api;
}

// Makes the lane's device current for one call and gives the caller's back (a device
// guard): the relay may run on the caller's thread, whose current device is its own.
class DeviceScope {
 public:
  DeviceScope(const CudaApi& rt, int device) : rt_(rt) {
    if (device < 0 || rt_.getDevice(&prev_) != kSuccess || prev_ == device) return;
    switched_ = rt_.setDevice(device) == kSuccess;
  }
  ~DeviceScope() {
    if (switched_) rt_.setDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  const CudaApi& rt_;
  int prev_ = -1;
  bool switched_ = false;
};

class CudaCopyLane final : public CopyLane {
 public:
  explicit CudaCopyLane(int device) : rt_(cudaApi()), device_(device) {
    DeviceScope on(rt_, device_);
    check(rt_.streamCreateWithFlags(&stream_, kStreamNonBlocking), "cudaStreamCreateWithFlags");
    for (auto& e : events_) check(rt_.eventCreateWithFlags(&e, kEventDisableTiming), "cudaEventCreateWithFlags");
    check(rt_.eventCreateWithFlags(&after_, kEventDisableTiming), "cudaEventCreateWithFlags");
  }
  ~CudaCopyLane() override {
    DeviceScope on(rt_, device_);
    try {
      drain();
    } catch (...) {
    }
    for (auto& e : events_)
      if (e) rt_.eventDestroy(e);
    if (after_) rt_.eventDestroy(after_);
    if (stream_) rt_.streamDestroy(stream_);
  }

  void orderAfter(void* stream) override {
    DeviceScope on(rt_, device_);
    check(rt_.eventRecord(after_, stream), "cudaEventRecord");
    check(rt_.streamWaitEvent(stream_, after_, 0), "cudaStreamWaitEvent");  // a device-side wait
  }
  uint64_t post(void* dst, const void* src, size_t n) override {
    DeviceScope on(rt_, device_);
    uint64_t t = posted_ + 1;
    if (t - done_ > kEvents) {
      check(rt_.eventSynchronize(events_[(t - kEvents) % kEvents]), "cudaEventSynchronize");
      completed();
    }
    if (posted_ == done_) busyFrom_ = monoNs();
    if (n) check(rt_.memcpyAsync(dst, src, n, kMemcpyDefault, stream_), "cudaMemcpyAsync");
    check(rt_.eventRecord(events_[t % kEvents], stream_), "cudaEventRecord");
    posted_ = t;
    return t;
  }
  uint64_t completed() override {
    if (done_ == posted_) return done_;
    DeviceScope on(rt_, device_);
    while (done_ < posted_) {
      cudaError_t rc = rt_.eventQuery(events_[(done_ + 1) % kEvents]);
      if (rc == kNotReady) break;
      check(rc, "cudaEventQuery");
      if (++done_ == posted_) busy_ += monoNs() - busyFrom_;
    }
    return done_;
  }
  void waitFor(uint64_t ticket, int64_t timeoutNs) override {
    int64_t end = monoNs() + timeoutNs;
    while (completed() < ticket && monoNs() < end) sched_yield();
  }
  void drain() override {
    if (posted_ == done_) return;
    DeviceScope on(rt_, device_);
    check(rt_.streamSynchronize(stream_), "cudaStreamSynchronize");  // our stream only
    completed();
  }
  int64_t busyNs() override { return busy_; }
  uint8_t* allocStaging(size_t bytes) override {
    DeviceScope on(rt_, device_);
    void* p = nullptr;
    check(rt_.hostAlloc(&p, bytes ? bytes : 1, 0), "cudaHostAlloc");  // pinned: DMA-able, async copies
    return static_cast<uint8_t*>(p);
  }
  void freeStaging(uint8_t* p) override { rt_.freeHost(p); }

 private:
  void check(cudaError_t rc, const char* what) {
    if (rc == kSuccess) return;
    rt_.getLastError();  // clear the sticky-free error state
    throw Error(strFormat("relay stage 'cuda': %s failed: %s (%d) [%s, device %d]", what, rt_.getErrorString(rc), rc,
                          rt_.path.c_str(), device_));
  }

  const CudaApi& rt_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[kEvents]{};
  cudaEvent_t after_ = nullptr;  // marks the caller's stream for orderAfter()
  uint64_t posted_ = 0, done_ = 0;
  int64_t busy_ = 0, busyFrom_ = 0;
};

}  // namespace

std::unique_ptr<CopyLane> makeCudaCopyLane(int device) { return std::make_unique<CudaCopyLane>(device); }

}  // namespace hetobs
