#pragma once
// Settings a communicator runs with. Python (hetobs/config.py) validates the
// HETOBS_* variables and fills this; the LD_PRELOAD paths will fill it from the
// environment in C++.
#include <cstddef>
#include <string>

namespace hetobs {

enum class TransportChoice { kAuto, kShm, kTcp };

struct CommConfig {
  int rank = 0;
  int size = 1;
  std::string job_id;
  std::string secret;  // empty: handshakes keyed by the job id, with a warning
  TransportChoice transport = TransportChoice::kAuto;
  double timeout_s = 600.0;          // per-op default
  double connect_timeout_s = 60.0;   // rendezvous and connections
  size_t small_bytes = 65536;        // all_reduce latency path threshold
  size_t shm_ring_bytes = 4 << 20;   // per incoming ring, shrunk for many local peers
  // Observation (the watchdog issue): where dumps go and when the watchdog fires.
  bool watchdog = true;  // false: no watchdog, stats segment or dumps (records stay private)
  std::string dir = "/tmp/hetobs";
  double hang_timeout_s = 300.0;
  bool abort_on_hang = false;
  int dump_signal = 0;
  uint32_t records = 2048;
  std::string bw_log = "off";
  double bw_log_interval_s = 15;
  std::string bw_log_file;
};

TransportChoice parseTransport(const std::string& s);  // throws Error naming the value

}  // namespace hetobs
