#pragma once
// The stand-in accelerator's "driver": device memory, streams, events and copy engines.
//
// What it models, because the hetobs relay depends on it:
// - Device memory is not host memory. A device address is a host allocation with bit 62
//   flipped: a non-canonical x86-64 address, so host code that reads a device tensor's
//   data_ptr() as if it were host memory faults instead of silently working. Only the
//   device's own kernels and copy engines translate (untag()).
// - Streams are in-order queues, each drained by a worker thread; work on one stream runs
//   in the order issued, work on different streams is unordered unless an event says so
//   (record on one, block on another).
// - Host<->device copies run on two copy engines per device (one per direction) shared by
//   all streams, like a DMA engine: a copy of n bytes takes n / bandwidth of wall time,
//   during which the stream worker sleeps (a DMA engine does not use a CPU core; the bytes
//   themselves are moved with one memcpy first). Bandwidth 0 means unpaced.
// - A copy between pinned host memory and the device is asynchronous when asked to be
//   (non_blocking); from pageable memory it is synchronous, as with real drivers.
// - Kernels (everything else) run on the calling host thread, after the current stream's
//   queued work has finished: compute is synchronous here.
// What it does not model: device compute time, memory limits, peer-to-peer copies
// between devices, multiple processes sharing one device, device-side faults.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace standin {

constexpr uint64_t kDeviceTag = uint64_t(1) << 62;
constexpr int kPoolStreams = 8;  // stream ids 1..8 per device; 0 is the default stream

inline void* tag(void* host) { return reinterpret_cast<void*>(reinterpret_cast<uint64_t>(host) ^ kDeviceTag); }
inline void* untag(const void* dev) {
  return reinterpret_cast<void*>(reinterpret_cast<uint64_t>(dev) ^ kDeviceTag);
}
inline bool isDevicePtr(const void* p) { return (reinterpret_cast<uint64_t>(p) & kDeviceTag) != 0; }

enum class Direction : int { kH2D = 0, kD2H = 1 };

// One DMA engine: copies on it are serialised in time at `bandwidth` bytes per ns.
struct Engine {
  std::mutex m;
  double bytes_per_ns = 0;  // 0: unpaced
  int64_t free_at_ns = 0;   // when the engine finishes the copies already admitted
  std::atomic<uint64_t> bytes{0}, copies{0};
  std::atomic<int64_t> busy_ns{0};
};

class Stream;

// An event: the position of a stream's queue at the time it was recorded.
struct Event {
  Stream* stream = nullptr;  // null until recorded
  uint64_t seq = 0;
  std::shared_ptr<std::atomic<int64_t>> stamp;  // when that position was reached (elapsed_time)
};

class Stream {
 public:
  Stream(int device, int index);
  ~Stream();
  int device() const { return device_; }
  int index() const { return index_; }

  // Queue `fn` (engine copy of `bytes` when `engine` is set); returns its position.
  uint64_t enqueue(std::function<void()> fn, Engine* engine = nullptr, size_t bytes = 0);
  // Queue a wait: later work on this stream starts after `other` reached `seq`.
  void enqueueWait(Stream* other, uint64_t seq);
  uint64_t issued();
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  void synchronize();                 // host waits for everything issued so far
  // Times a host thread blocked on this stream (synchronize, an event's synchronize, a
  // blocking copy): lets tests tell device-side ordering from a host synchronisation.
  std::atomic<uint64_t> host_waits{0};

 private:
  struct Item {
    std::function<void()> fn;
    Engine* engine = nullptr;
    size_t bytes = 0;
    Stream* wait_stream = nullptr;
    uint64_t wait_seq = 0;
    int64_t enqueued_ns = 0;
  };
  void run();

  int device_, index_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Item> q_;
  uint64_t issued_ = 0;
  std::atomic<uint64_t> completed_{0};
  bool stop_ = false;
  // When the device finished this stream's last item, on the device's own timeline: a copy
  // starts when it was queued and its predecessor ended (and its engine was free), however
  // late the worker thread got to it, as a DMA engine does not wait for a host thread.
  int64_t device_time_ns_ = 0;  // worker thread only
  std::thread worker_;
};

// A host thread waits until `s` reached `seq` (counted in s->host_waits when it blocks).
void waitFor(Stream* s, uint64_t seq);

int deviceCount();
int currentDevice();
void setCurrentDevice(int d);  // checked
Stream* stream(int device, int index);  // index 0..kPoolStreams
Stream* currentStream(int device);
void setCurrentStream(int device, int index);
Stream* nextPoolStream(int device);
Engine& engine(int device, Direction dir);
void setBandwidth(double h2d_gbps, double d2h_gbps);  // all devices; 0 = unpaced
void synchronizeDevice(int device);

// Device memory (tagged addresses) and pinned host memory. Frees are deferred until the
// work every stream had issued at the time of the free has completed, since a queued
// copy may still read or write the block (what a stream-ordered allocator guarantees).
void* deviceAlloc(int device, size_t bytes);
void deviceFree(void* p);
void* pinnedAlloc(size_t bytes);
void pinnedFree(void* p);
bool isPinned(const void* p);
int64_t deviceBytesInUse();

int64_t nowNs();

}  // namespace standin
