#pragma once
// Health of one TCP connection as the kernel sees it (getsockopt TCP_INFO), sampled off
// the hot path: by the watchdog about once a second, and whenever links() or a dump reads
// the link. Each field is a single relaxed atomic (two samplers may race; every value is
// a whole sample of that field). `samples` == 0: never sampled (shm, or not yet).
// Lives at the end of stats::LinkStats so readers of the shorter layout still work.
#include <atomic>
#include <cstdint>

namespace hetobs {

struct LinkHealth {
  std::atomic<uint64_t> samples{0};
  std::atomic<int64_t> sampled_ns{0};         // wall clock of the latest sample
  std::atomic<uint64_t> rtt_us{0}, rttvar_us{0};
  std::atomic<uint64_t> retransmits_total{0};  // segments retransmitted over the connection's life
  std::atomic<uint64_t> retransmitting{0};     // consecutive timeouts now (tcpi_retransmits): > 0 while stuck
  std::atomic<uint64_t> unacked{0}, lost{0};   // segments in flight unacknowledged / presumed lost
  std::atomic<uint64_t> delivery_rate_bps{0};  // bytes per second, the kernel's latest estimate
  std::atomic<uint64_t> bytes_acked{0}, bytes_received{0};
  // Milliseconds since the last packet of each kind; what tells which direction is silent.
  std::atomic<uint64_t> ms_since_data_sent{0}, ms_since_data_recv{0}, ms_since_ack_recv{0};
  // 1: the delivery-rate sample was taken while the sender had nothing more to send (it says
  // how fast the application sent, not what the path carries); 0: a measure of the path.
  std::atomic<uint64_t> rate_app_limited{0};
};

// A plain copy of a LinkHealth (links(), bindings).
struct LinkHealthSnapshot {
  uint64_t samples = 0;
  int64_t sampled_ns = 0;
  uint64_t rtt_us = 0, rttvar_us = 0, retransmits_total = 0, retransmitting = 0, unacked = 0, lost = 0;
  uint64_t delivery_rate_bps = 0, bytes_acked = 0, bytes_received = 0;
  uint64_t ms_since_data_sent = 0, ms_since_data_recv = 0, ms_since_ack_recv = 0;
  uint64_t rate_app_limited = 0;

  static LinkHealthSnapshot of(const LinkHealth& h) {
    LinkHealthSnapshot s;
    s.samples = h.samples.load();
    s.sampled_ns = h.sampled_ns.load();
    s.rtt_us = h.rtt_us.load();
    s.rttvar_us = h.rttvar_us.load();
    s.retransmits_total = h.retransmits_total.load();
    s.retransmitting = h.retransmitting.load();
    s.unacked = h.unacked.load();
    s.lost = h.lost.load();
    s.delivery_rate_bps = h.delivery_rate_bps.load();
    s.bytes_acked = h.bytes_acked.load();
    s.bytes_received = h.bytes_received.load();
    s.ms_since_data_sent = h.ms_since_data_sent.load();
    s.ms_since_data_recv = h.ms_since_data_recv.load();
    s.ms_since_ack_recv = h.ms_since_ack_recv.load();
    s.rate_app_limited = h.rate_app_limited.load();
    return s;
  }
};

}  // namespace hetobs
