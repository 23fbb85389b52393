#include "runtime.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>

namespace standin {
namespace {

std::mutex g_progress_m;  // every stream's completion is announced here
std::condition_variable g_progress_cv;

double envGbps(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  if (end == v || *end || d < 0) throw std::invalid_argument(std::string(name) + "=" + v + ": expected GB/s >= 0");
  return d;
}

int envDevices() {
  const char* v = std::getenv("STANDIN_DEVICES");
  if (!v || !*v) return 2;
  int n = std::atoi(v);
  return n < 0 ? 0 : (n > 16 ? 16 : n);
}

struct Device {
  Engine engines[2];
  std::atomic<Stream*> streams[kPoolStreams + 1] = {};  // made on first use, never freed (workers run to exit)
  std::atomic<int> next_pool{0};
  std::once_flag made[kPoolStreams + 1];
};

struct Runtime {
  int count;
  std::vector<std::unique_ptr<Device>> devices;
  Runtime() : count(envDevices()) {
    double both = envGbps("STANDIN_COPY_GBPS", 0);
    double h2d = envGbps("STANDIN_H2D_GBPS", both), d2h = envGbps("STANDIN_D2H_GBPS", both);
    for (int i = 0; i < count; ++i) {
      devices.push_back(std::make_unique<Device>());
      devices.back()->engines[int(Direction::kH2D)].bytes_per_ns = h2d;
      devices.back()->engines[int(Direction::kD2H)].bytes_per_ns = d2h;
    }
  }
};

Runtime& rt() {
  static Runtime* r = new Runtime();  // leaked: stream workers may outlive static destruction
  return *r;
}

Device& dev(int d) {
  if (d < 0 || d >= rt().count)
    throw std::out_of_range("standin: device " + std::to_string(d) + " does not exist (" +
                            std::to_string(rt().count) + " devices; STANDIN_DEVICES)");
  return *rt().devices[size_t(d)];
}

thread_local int t_device = 0;
thread_local int t_stream[16] = {0};

// Blocks freed while work may still touch them, with what each stream had issued then.
struct Deferred {
  void* host;
  bool pinned;
  std::vector<std::pair<Stream*, uint64_t>> marks;
};
std::mutex g_mem_m;
std::vector<Deferred> g_deferred;
std::map<uintptr_t, size_t> g_pinned;  // start -> bytes
std::atomic<int64_t> g_device_bytes{0};
std::map<uintptr_t, size_t> g_device_sizes;

std::vector<std::pair<Stream*, uint64_t>> marksNow() {
  std::vector<std::pair<Stream*, uint64_t>> marks;
  for (auto& d : rt().devices)
    for (auto& a : d->streams)
      if (Stream* s = a.load(std::memory_order_acquire); s && s->issued() > s->completed())
        marks.emplace_back(s, s->issued());
  return marks;
}

void reclaimLocked() {
  for (size_t i = 0; i < g_deferred.size();) {
    bool done = true;
    for (auto& [s, seq] : g_deferred[i].marks) done = done && s->completed() >= seq;
    if (!done) {
      ++i;
      continue;
    }
    if (g_deferred[i].pinned) g_pinned.erase(reinterpret_cast<uintptr_t>(g_deferred[i].host));
    std::free(g_deferred[i].host);
    g_deferred[i] = g_deferred.back();
    g_deferred.pop_back();
  }
}

void deferFree(void* host, bool pinned) {
  std::lock_guard<std::mutex> g(g_mem_m);
  auto marks = marksNow();
  if (marks.empty()) {
    if (pinned) g_pinned.erase(reinterpret_cast<uintptr_t>(host));
    std::free(host);
  } else {
    g_deferred.push_back(Deferred{host, pinned, std::move(marks)});
  }
  reclaimLocked();
}

void* hostBlock(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0) throw std::bad_alloc();
  return p;
}

void announce() {
  std::lock_guard<std::mutex> g(g_progress_m);
  g_progress_cv.notify_all();
}

// Any thread (a stream worker honouring an event, or the host) until `s` reached `seq`.
void blockUntil(Stream* s, uint64_t seq) {
  std::unique_lock<std::mutex> g(g_progress_m);
  g_progress_cv.wait(g, [&] { return s->completed() >= seq; });
}

}  // namespace

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

Stream::Stream(int device, int index) : device_(device), index_(index), worker_([this] { run(); }) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

uint64_t Stream::enqueue(std::function<void()> fn, Engine* engine, size_t bytes) {
  std::lock_guard<std::mutex> g(m_);
  Item it;
  it.fn = std::move(fn);
  it.engine = engine;
  it.bytes = bytes;
  it.enqueued_ns = nowNs();
  q_.push_back(std::move(it));
  uint64_t seq = ++issued_;
  cv_.notify_one();
  return seq;
}

void Stream::enqueueWait(Stream* other, uint64_t seq) {
  if (other == this || other->completed() >= seq) return;  // in order already, or reached
  std::lock_guard<std::mutex> g(m_);
  Item it;
  it.wait_stream = other;
  it.wait_seq = seq;
  q_.push_back(std::move(it));
  ++issued_;
  cv_.notify_one();
}

uint64_t Stream::issued() {
  std::lock_guard<std::mutex> g(m_);
  return issued_;
}

void Stream::synchronize() { waitFor(this, issued()); }

void Stream::run() {
  for (;;) {
    Item it;
    {
      std::unique_lock<std::mutex> g(m_);
      cv_.wait(g, [this] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      it = std::move(q_.front());
      q_.pop_front();
    }
    if (it.wait_stream) {  // a device-side wait: this stream stalls, no host thread does
      if (it.wait_stream->completed() < it.wait_seq) blockUntil(it.wait_stream, it.wait_seq);
    } else if (it.engine) {
      Engine& e = *it.engine;
      int64_t start, end;
      {
        std::lock_guard<std::mutex> g(e.m);
        start = std::max({it.enqueued_ns, device_time_ns_, e.free_at_ns});
        end = start + (e.bytes_per_ns > 0 ? int64_t(double(it.bytes) / e.bytes_per_ns) : 0);
        e.free_at_ns = end;
      }
      int64_t t0 = nowNs();
      it.fn();  // the bytes move now; the engine is modelled as busy until `end`
      int64_t t1 = nowNs();
      if (end > t1) {
        timespec ts{time_t(end / 1000000000), long(end % 1000000000)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) != 0) {
        }
      }
      e.bytes.fetch_add(it.bytes, std::memory_order_relaxed);
      e.copies.fetch_add(1, std::memory_order_relaxed);
      e.busy_ns.fetch_add(e.bytes_per_ns > 0 ? end - start : t1 - t0, std::memory_order_relaxed);
      device_time_ns_ = std::max(end, t1);
    } else if (it.fn) {
      it.fn();
    }
    if (!it.engine) device_time_ns_ = std::max(device_time_ns_, nowNs());  // waits and markers: as they ran
    completed_.fetch_add(1, std::memory_order_acq_rel);
    announce();
  }
}

void waitFor(Stream* s, uint64_t seq) {
  if (s->completed() >= seq) return;
  s->host_waits.fetch_add(1, std::memory_order_relaxed);
  blockUntil(s, seq);
}

int deviceCount() { return rt().count; }
int currentDevice() { return t_device; }
void setCurrentDevice(int d) {
  dev(d);  // checks
  t_device = d;
}

Stream* stream(int device, int index) {
  Device& d = dev(device);
  if (index < 0 || index > kPoolStreams)
    throw std::out_of_range("standin: stream id " + std::to_string(index) + " does not exist");
  std::call_once(d.made[index], [&] { d.streams[index].store(new Stream(device, index), std::memory_order_release); });
  return d.streams[index].load(std::memory_order_acquire);
}

Stream* currentStream(int device) { return stream(device, t_stream[device]); }
void setCurrentStream(int device, int index) {
  stream(device, index);  // checks
  t_stream[device] = index;
}
Stream* nextPoolStream(int device) {
  int i = dev(device).next_pool.fetch_add(1) % kPoolStreams;
  return stream(device, 1 + i);
}

Engine& engine(int device, Direction dir) { return dev(device).engines[int(dir)]; }

void setBandwidth(double h2d_gbps, double d2h_gbps) {
  for (auto& d : rt().devices) {
    for (int k = 0; k < 2; ++k) {
      std::lock_guard<std::mutex> g(d->engines[k].m);
      d->engines[k].bytes_per_ns = k == int(Direction::kH2D) ? h2d_gbps : d2h_gbps;
    }
  }
}

void synchronizeDevice(int device) {
  for (int i = 0; i <= kPoolStreams; ++i) {
    if (Stream* s = dev(device).streams[i].load(std::memory_order_acquire)) s->synchronize();
  }
}

void* deviceAlloc(int device, size_t bytes) {
  dev(device);
  void* host = hostBlock(bytes);
  {
    std::lock_guard<std::mutex> g(g_mem_m);
    g_device_sizes[reinterpret_cast<uintptr_t>(host)] = bytes;
    reclaimLocked();
  }
  g_device_bytes.fetch_add(int64_t(bytes));
  return tag(host);
}

void deviceFree(void* p) {
  if (!p) return;
  void* host = untag(p);
  {
    std::lock_guard<std::mutex> g(g_mem_m);
    auto it = g_device_sizes.find(reinterpret_cast<uintptr_t>(host));
    if (it != g_device_sizes.end()) {
      g_device_bytes.fetch_sub(int64_t(it->second));
      g_device_sizes.erase(it);
    }
  }
  deferFree(host, false);
}

void* pinnedAlloc(size_t bytes) {
  void* p = hostBlock(bytes);
  std::lock_guard<std::mutex> g(g_mem_m);
  g_pinned[reinterpret_cast<uintptr_t>(p)] = bytes ? bytes : 1;
  reclaimLocked();
  return p;
}

void pinnedFree(void* p) {
  if (p) deferFree(p, true);
}

bool isPinned(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> g(g_mem_m);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a < it->first + it->second;
}

int64_t deviceBytesInUse() { return g_device_bytes.load(); }

}  // namespace standin
