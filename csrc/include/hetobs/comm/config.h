#pragma once
// Settings a communicator runs with. Python (hetobs/config.py) validates the
// HETOBS_* variables and fills this; the LD_PRELOAD paths will fill it from the
// environment in C++.
#include <cstddef>
#include <string>

#include "hetobs/observe/runtime.h"

namespace hetobs {

enum class TransportChoice { kAuto, kShm, kTcp };

struct CommConfig {
  int rank = 0;
  int size = 1;
  std::string job_id;
  // job_id was generated on this rank (none was set): rank 0's id replaces it at rendezvous.
  bool job_id_generated = false;
  std::string secret;  // empty: handshakes keyed by the job id, with a warning
  TransportChoice transport = TransportChoice::kAuto;
  double timeout_s = 600.0;          // per-op default
  double connect_timeout_s = 60.0;   // rendezvous and connections
  size_t small_bytes = 65536;        // all_reduce latency path threshold
  size_t shm_ring_bytes = 4 << 20;   // per incoming ring, shrunk for many local peers
  bool watchdog = true;  // false: no watchdog, stats segment or dumps (records stay private)
  // What the process's Runtime is made with (job, secret, rank and size are filled in from above).
  RuntimeConfig observe;
};

TransportChoice parseTransport(const std::string& s);  // throws Error naming the value

}  // namespace hetobs
