#pragma once
// Per-peer progress of the in-flight op and cumulative per-link counters. Written
// with relaxed atomic stores by the thread running the op (no locks); read by
// anyone (records(), the watchdog, a dump) at any time.
//
// Steps are transport frames ("chunks"). For one peer and one direction:
//   send: posted (messages queued) -> sent (frames handed to the transport)
//         -> acked (frames the peer confirmed) ; done (messages completed)
//   recv: posted (messages expected) -> received (frames arrived) ; done (messages completed)
// A diagnosis walks these along the algorithm's edges: sender sent, receiver never
// received -> the link; received but never forwarded -> the rank.
#include <atomic>
#include <cstdint>

namespace hetobs {

struct PeerProgress {
  std::atomic<uint64_t> send_posted{0}, send_sent{0}, send_acked{0}, send_done{0};
  std::atomic<uint64_t> recv_posted{0}, recv_received{0}, recv_done{0};
  std::atomic<int64_t> last_change_ns{0};

  void reset() {
    for (auto* a : {&send_posted, &send_sent, &send_acked, &send_done, &recv_posted, &recv_received, &recv_done})
      a->store(0, std::memory_order_relaxed);
    last_change_ns.store(0, std::memory_order_relaxed);
  }
  static void bump(std::atomic<uint64_t>& a, uint64_t by = 1) {
    a.store(a.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }
};

struct LinkCounters {
  std::atomic<uint64_t> bytes_sent{0}, bytes_recv{0};
  std::atomic<uint64_t> frames_sent{0}, frames_recv{0};
  std::atomic<int64_t> busy_ns{0};          // time with a transfer pending on this link
  std::atomic<int64_t> last_activity_ns{0};  // monotonic time of the last byte moved

  static void add(std::atomic<uint64_t>& a, uint64_t by) {
    a.store(a.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }
};

}  // namespace hetobs
