// monoNs()'s slow path: deciding whether the TSC can stand in for CLOCK_MONOTONIC, calibrating
// it, and re-anchoring it once a second (common/clock.h has the fast path).
#include "hetobs/common/clock.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#endif

namespace hetobs {
namespace clock_detail {

TscClock gTsc;

#if defined(__x86_64__)
namespace {

constexpr int64_t kCalibrateNs = 10'000'000;  // the first rate is measured over at least 10 ms
constexpr int64_t kSpanNs = 1'000'000'000;    // re-anchored to CLOCK_MONOTONIC every second
constexpr int64_t kStepNs = 1'000'000;        // an error beyond 1 ms is stepped (forward only), not slewed

enum Mode { kUnknown = 0, kTsc = 1, kSystem = 2 };
std::atomic<int> gMode{kUnknown};
std::atomic<bool> gBusy{false};  // one thread anchors at a time; the others read clock_gettime meanwhile

// The last (CLOCK_MONOTONIC, TSC) pair, read and written only by the thread holding gBusy.
bool gHaveAnchor = false;
int64_t gAnchorNs = 0;
uint64_t gAnchorTsc = 0;

// The TSC ticks at a constant rate whatever the core's frequency and sleep state (CPUID's
// invariant TSC bit), and the kernel keeps CLOCK_MONOTONIC with it: it found the counters of
// all CPUs in step (a VM whose TSC it distrusts runs on kvm-clock or hpet instead).
bool tscUsable() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000007, &a, &b, &c, &d) || !(d & (1u << 8))) return false;
  int fd = ::open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[16] = {};
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  return n >= 3 && std::strncmp(buf, "tsc", 3) == 0 && (buf[3] == '\n' || buf[3] == 0);
}

// A CLOCK_MONOTONIC reading and the TSC at the same moment: the counter halfway between two
// reads around clock_gettime, from the tightest of three tries.
void readPair(int64_t* ns, uint64_t* tsc) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 3; ++i) {
    uint64_t a = __rdtsc();
    int64_t n = systemMonoNs();
    uint64_t b = __rdtsc();
    if (b - a < best) {
      best = b - a;
      *ns = n;
      *tsc = a + (b - a) / 2;
    }
  }
}

void publish(uint64_t tsc0, int64_t ns0, uint64_t mult, uint64_t span) {
  uint32_t s = gTsc.seq.load(std::memory_order_relaxed);
  gTsc.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  gTsc.tsc0.store(tsc0, std::memory_order_relaxed);
  gTsc.ns0.store(ns0, std::memory_order_relaxed);
  gTsc.mult.store(mult, std::memory_order_relaxed);
  gTsc.span.store(span, std::memory_order_relaxed);
  gTsc.seq.store(s + 2, std::memory_order_release);
}

// Holding gBusy: anchor at (now, t) and return the clock's value there.
int64_t anchor(int64_t now, uint64_t t) {
  if (!gHaveAnchor) {
    gHaveAnchor = true;
    gAnchorNs = now;
    gAnchorTsc = t;
    return now;
  }
  int64_t dn = now - gAnchorNs;
  uint64_t dt = t - gAnchorTsc;
  if (dn < kCalibrateNs) return now;  // calibrating: too short a baseline for a rate yet
  // ns per tick in 32.32 fixed point; a TSC outside 100 MHz .. 16 GHz is not believed.
  if (dt == 0 || dn <= 0 || dt > (uint64_t(dn) << 4) || uint64_t(dn) > dt * 10) {
    gMode.store(kSystem, std::memory_order_relaxed);
    publish(0, 0, 0, 0);
    return now;
  }
  uint64_t rate = uint64_t(((unsigned __int128)uint64_t(dn) << 32) / dt);
  uint64_t span = uint64_t(((unsigned __int128)uint64_t(kSpanNs) << 32) / rate);
  uint64_t mult = rate;
  int64_t ns0 = now;
  uint64_t oldSpan = gTsc.span.load(std::memory_order_relaxed);
  if (oldSpan != 0) {
    // What the clock says at t, continued from its last anchor (mult and tsc0 are this
    // thread's own writes). Slew the error out over the next second, so the clock neither
    // jumps nor runs backwards; only a large error (the VM was paused) is stepped, forward.
    uint64_t t0 = gTsc.tsc0.load(std::memory_order_relaxed);
    uint64_t m0 = gTsc.mult.load(std::memory_order_relaxed);
    int64_t ours = gTsc.ns0.load(std::memory_order_relaxed) + int64_t((unsigned __int128)(t - t0) * m0 >> 32);
    int64_t err = now - ours;
    if (err > kStepNs) {
      ns0 = now;
    } else {
      ns0 = ours;
      int64_t fix = err < -kStepNs ? -kStepNs : err;  // far ahead: catch up no faster than 0.1%
      __int128 m = (__int128)rate + (__int128)fix * ((__int128)1 << 32) / (__int128)span;  // (no shift of a negative)
      mult = m > 0 ? uint64_t(m) : 1;
    }
  }
  publish(t, ns0, mult, span);
  gAnchorNs = now;
  gAnchorTsc = t;
  return ns0;
}

// While another thread anchors: the last parameters, continued past their span (still within
// microseconds of CLOCK_MONOTONIC), so this clock does not step back to clock_gettime's value.
int64_t extrapolated() {
  for (int i = 0; i < 16; ++i) {
    TscRead r = readTsc();
    if (!r.consistent()) continue;
    if (r.span == 0 || r.t < r.t0) break;
    return r.value();
  }
  return systemMonoNs();
}

}  // namespace

int64_t monoNsSlow() {
  int mode = gMode.load(std::memory_order_relaxed);
  if (mode == kSystem) return systemMonoNs();
  if (mode == kUnknown) {
    mode = tscUsable() ? kTsc : kSystem;  // the same answer in every thread that races here
    gMode.store(mode, std::memory_order_relaxed);
    if (mode == kSystem) return systemMonoNs();
  }
  if (gBusy.exchange(true, std::memory_order_acquire)) return extrapolated();
  int64_t now = 0;
  uint64_t t = 0;
  readPair(&now, &t);
  int64_t v = anchor(now, t);
  gBusy.store(false, std::memory_order_release);
  return v;
}
#else
int64_t monoNsSlow() { return systemMonoNs(); }
#endif

}  // namespace clock_detail
}  // namespace hetobs
