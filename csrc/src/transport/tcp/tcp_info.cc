#include "hetobs/transport/tcp/tcp_info.h"

// linux/tcp.h, not netinet/tcp.h: glibc's copy of struct tcp_info stops before the byte
// counters and the delivery rate.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstring>

#include "hetobs/common/clock.h"

namespace hetobs {
namespace tcp {

bool sampleTcpInfo(int fd, LinkHealth& out) {
  if (fd < 0) return false;
  tcp_info ti;
  memset(&ti, 0, sizeof ti);
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  auto has = [len](size_t fieldEnd) { return size_t(len) >= fieldEnd; };
  auto set = [](std::atomic<uint64_t>& a, uint64_t v) { a.store(v, std::memory_order_relaxed); };
  set(out.rtt_us, ti.tcpi_rtt);
  set(out.rttvar_us, ti.tcpi_rttvar);
  set(out.retransmits_total, ti.tcpi_total_retrans);
  set(out.retransmitting, ti.tcpi_retransmits);
  set(out.unacked, ti.tcpi_unacked);
  set(out.lost, ti.tcpi_lost);
  set(out.ms_since_data_sent, ti.tcpi_last_data_sent);
  set(out.ms_since_data_recv, ti.tcpi_last_data_recv);
  set(out.ms_since_ack_recv, ti.tcpi_last_ack_recv);
  // Older kernels return a shorter struct: take only the fields they filled.
  if (has(offsetof(tcp_info, tcpi_bytes_acked) + sizeof ti.tcpi_bytes_acked)) set(out.bytes_acked, ti.tcpi_bytes_acked);
  if (has(offsetof(tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received))
    set(out.bytes_received, ti.tcpi_bytes_received);
  if (has(offsetof(tcp_info, tcpi_delivery_rate) + sizeof ti.tcpi_delivery_rate)) {
    set(out.delivery_rate_bps, ti.tcpi_delivery_rate);
    set(out.rate_app_limited, ti.tcpi_delivery_rate_app_limited);  // came with the rate (Linux 4.9)
  }
  out.sampled_ns.store(wallNs(), std::memory_order_relaxed);
  out.samples.store(out.samples.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return true;
}

}  // namespace tcp
}  // namespace hetobs
