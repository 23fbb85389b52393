#pragma once
// How the op thread waits for its peers (progress.cc): spin briefly (a peer on the same host
// usually answers within microseconds), then yield (ranks may outnumber cores), then sleep:
// on the shared-memory doorbell (a futex) or on the sockets (EpollSet). Sleeps are bounded
// so the loop still notices deadlines, abort words and dead peers. When the host's members
// outnumber our CPUs the spin is skipped: the peer we wait for is likely waiting for our
// core, and sched_yield hands it over where PAUSE would burn it.
#include <atomic>
#include <cstdint>

namespace hetobs {

class WaitPolicy {
 public:
  static constexpr int64_t kSpinNs = 20000;          // busy-poll this long after the last progress
  static constexpr int64_t kMinSpinNs = 1000;        // the shortest the spin adapts down to (adapt)
  static constexpr int64_t kYieldNs = 200000;        // then yield the core this long
  static constexpr int64_t kTcpSpinNs = 5000;        // links all TCP: spin this long, then poll()
  static constexpr int64_t kSleepNs = 20000000;      // then sleep at most this long per wait
  static constexpr int64_t kLongSleepNs = 100000000;  // the longest sleep of a wait that has lasted a while
  // PAUSEs between two polls of a spinning wait. One PAUSE is ~140 cycles on Skylake and later
  // (42 ns measured here), ~10 on older cores: 32 of them made each poll ~1.35 us apart, about
  // the whole of an 8 B all_reduce at 2 ranks, so data arriving just after a poll waited that long.
  static constexpr int kPausesPerPoll = 1;

  enum class Step { kSpin, kYield, kSleep };

  // What a wait of exchange() does after `idle` ns with nothing moving. Over TCP the kernel
  // moves the bytes: sleeping in poll() early leaves it the core.
  Step next(int64_t idle, bool anyShm, bool oversubscribed) const {
    return step(idle, !anyShm ? kTcpSpinNs : oversubscribed ? 0 : spinNs_, anyShm ? kYieldNs : 0);
  }
  // The same for the relay pipeline (exchangeFed): with staging copies in flight the copy
  // threads need the cores, so it sleeps at once (their completions ring the doorbell).
  static Step nextFed(int64_t idle, bool anyShm, bool oversubscribed, bool copying) {
    return step(idle, copying ? 0 : !anyShm ? kTcpSpinNs : oversubscribed ? 0 : kSpinNs,
                copying || !anyShm ? 0 : kYieldNs);
  }

  // A wait that spun out (the peer did not answer within the spin) halves the next wait's
  // spin, down to kMinSpinNs; one that ended while spinning doubles it back, up to kSpinNs. A
  // peer that shares our core (ranks are not bound; a loaded host) cannot answer while we
  // spin: each op then cost a whole spin (~20 us) before the yield let the peer run. 8 B
  // all_reduce at 2 native ranks, load average 6.3 on 2 cores: 3.2-6.5 us, 11-59 us before.
  void adapt(bool spun, bool spunOut) {
    if (spunOut) spinNs_ = spinNs_ / 2 > kMinSpinNs ? spinNs_ / 2 : kMinSpinNs;
    else if (spun) spinNs_ = spinNs_ * 2 < kSpinNs ? spinNs_ * 2 : kSpinNs;
  }

  // How long a wait with nothing moving may sleep: kSleepNs at first, growing with the wait
  // to kLongSleepNs after a second. What matters (data, acks, aborts, EOF) wakes the wait at
  // once; the timer only bounds how soon the watchdog's abort request and a peer's redial
  // (reconnect.cc) are picked up. At 1,024 ranks waiting on one stopped rank, 50 wake-ups a
  // second each kept both cores busy, and the job-wide dump crawled (docs/PERF.md, "Scale").
  static int64_t idleSleepNs(int64_t idle) {
    int64_t t = idle / 10;
    return t < kSleepNs ? kSleepNs : t > kLongSleepNs ? kLongSleepNs : t;
  }

  // Whether this host's members (`countLocal()`, us included) outnumber the CPUs this process
  // may run on; worked out on the first call (the links are up by then) and kept.
  template <class CountLocal>
  bool oversubscribed(CountLocal countLocal) {
    int known = oversubscribed_.load(std::memory_order_relaxed);
    if (known < 0) {
      known = countLocal() > sharedCpus() ? 1 : 0;
      oversubscribed_.store(known, std::memory_order_relaxed);
    }
    return known == 1;
  }
  // CPUs the same-host ranks share (wait_policy.cc).
  static int sharedCpus();

 private:
  static Step step(int64_t idle, int64_t spin, int64_t yield) {
    return idle < spin ? Step::kSpin : idle < spin + yield ? Step::kYield : Step::kSleep;
  }
  int64_t spinNs_ = kSpinNs;  // this communicator's spin before yielding (adapts to how waits end)
  std::atomic<int> oversubscribed_{-1};  // -1: not worked out yet
};

}  // namespace hetobs
