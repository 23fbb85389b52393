// Host staging copies on a copy thread: the stand-in for a device copy engine, so the
// pipeline's overlap is exercised and measured on a machine without a device.
#include <sched.h>
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "hetobs/common/clock.h"
#include "hetobs/common/cpu_pause.h"
#include "hetobs/common/futex.h"
#include "hetobs/relay/copy_lane.h"


namespace hetobs {
namespace {

constexpr size_t kQueue = 64;           // copies outstanding at most (a fixed ring: no allocation per copy)
constexpr int64_t kSpinNs = 20000;      // the next chunk usually follows within microseconds
constexpr int64_t kSleepNs = 50000000;  // bounded sleeps so close() is noticed

class HostCopyLane final : public CopyLane {
 public:
  explicit HostCopyLane(std::function<void()> wake) : wake_(std::move(wake)) {
    thread_ = std::thread([this] { run(); });
  }
  ~HostCopyLane() override {
    stop_.store(true, std::memory_order_release);
    posted_bell_.ring();
    thread_.join();
  }

  uint64_t post(void* dst, const void* src, size_t n) override {
    uint64_t t = posted_.load(std::memory_order_relaxed) + 1;
    while (t - done_.load(std::memory_order_acquire) > kQueue) waitFor(t - kQueue, kSleepNs);
    jobs_[t % kQueue] = Job{dst, src, n};
    posted_.store(t, std::memory_order_release);
    posted_bell_.ring();
    return t;
  }
  uint64_t completed() override { return done_.load(std::memory_order_acquire); }
  void waitFor(uint64_t ticket, int64_t timeoutNs) override {
    int64_t end = monoNs() + timeoutNs;
    while (done_.load(std::memory_order_acquire) < ticket) {
      uint32_t seen = done_bell_.seq.load(std::memory_order_acquire);
      if (done_.load(std::memory_order_acquire) >= ticket) return;
      int64_t left = end - monoNs();
      if (left <= 0) return;
      done_bell_.wait(seen, left);
    }
  }
  void drain() override {
    uint64_t last = posted_.load(std::memory_order_relaxed);
    while (completed() < last) waitFor(last, kSleepNs);
  }
  int64_t busyNs() override { return busy_.load(std::memory_order_relaxed); }
  uint8_t* allocStaging(size_t bytes) override {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0) throw Error(strFormat("cannot allocate %zu bytes of relay staging", bytes));
    memset(p, 0, bytes);  // fault the pages in now, not during the first transfer
    return static_cast<uint8_t*>(p);
  }
  void freeStaging(uint8_t* p) override { free(p); }

 private:
  struct Job {
    void* dst;
    const void* src;
    size_t n;
  };

  void run() {
    uint64_t next = 1;
    int64_t idleSince = monoNs();
    while (!stop_.load(std::memory_order_acquire)) {
      if (posted_.load(std::memory_order_acquire) < next) {
        // Spin briefly, then sleep on the doorbell: on a 2-core machine a spinning copy
        // thread takes the core the wire or the peer needs.
        if (monoNs() - idleSince < kSpinNs) {
          for (int i = 0; i < 32; ++i) HETOBS_PAUSE();
          continue;
        }
        uint32_t seen = posted_bell_.seq.load(std::memory_order_acquire);
        if (posted_.load(std::memory_order_acquire) < next && !stop_.load(std::memory_order_acquire))
          posted_bell_.wait(seen, kSleepNs);
        continue;
      }
      const Job& j = jobs_[next % kQueue];
      int64_t t0 = monoNs();
      if (j.n) memcpy(j.dst, j.src, j.n);
      int64_t t1 = monoNs();
      busy_.store(busy_.load(std::memory_order_relaxed) + (t1 - t0), std::memory_order_relaxed);
      done_.store(next++, std::memory_order_release);
      done_bell_.ring();
      if (wake_) wake_();
      idleSince = t1;
    }
  }

  std::function<void()> wake_;
  Job jobs_[kQueue]{};
  std::atomic<uint64_t> posted_{0}, done_{0};
  std::atomic<int64_t> busy_{0};
  std::atomic<bool> stop_{false};
  Doorbell posted_bell_, done_bell_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<CopyLane> makeHostCopyLane(std::function<void()> wake) {
  return std::make_unique<HostCopyLane>(std::move(wake));
}

}  // namespace hetobs
