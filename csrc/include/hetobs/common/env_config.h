#pragma once
// The HETOBS_* settings read from the environment by native entry points that have no
// Python (the MPI and NCCL interposers). Same variables, defaults and validation as
// hetobs/config.py (the source of truth; keep the two in step): an invalid value is
// one message naming the variable, e.g. "HETOBS_RECORDS='abc': expected a number".
#include <cstdint>
#include <string>

#include "hetobs/observe/runtime.h"

namespace hetobs {

struct EnvSettings {
  std::string job_id;
  bool job_id_generated = false;  // none of HETOBS_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID was set
  std::string dir;
  std::string transport = "auto";
  std::string secret;
  double timeout = 600;
  double connect_timeout = 60;
  uint32_t records = 2048;
  double hang_timeout = 300;
  bool watchdog = true;
  bool abort_on_hang = false;
  int dump_signal = 0;  // 0: off
  uint64_t small_bytes = 65536;
  std::string debug = "WARN";  // ERROR | WARN | INFO | DEBUG
  double otel_sample = 0.01;
  std::string bw_log = "off";  // off | verbose | agg
  double bw_log_interval = 15;
  std::string bw_log_file;
};

// A numeric setting: how both parsers (this one and hetobs/config.py) read it. Floats
// take inf ("never", for timeouts) and refuse NaN; integers are bounded by `maximum`.
struct NumberSpec {
  const char* name;
  const char* dflt;
  double minimum;
  bool integer;
  long long maximum;  // integers only
};
constexpr int kNumberSettingCount = 12;
extern const NumberSpec kNumberSettings[kNumberSettingCount];

// Read every setting from the process environment (getenv). Returns false and sets
// *error (one line, no trailing newline) when a value cannot be used; never throws.
bool readEnvSettings(EnvSettings* out, std::string* error);

// Connection settings every connect path reads (read once per process).
struct NetSettings {
  int connect_retries = 100;      // HETOBS_CONNECT_RETRIES: attempts per connect
  double reconnect_timeout = 30;  // HETOBS_RECONNECT_TIMEOUT: seconds to re-make a broken link (inf: never give up)
};
NetSettings netSettings();
// HETOBS_SHM_SINGLE_COPY_BYTES: shared-memory messages from this size are read straight out of
// the sender's buffer (transport/shm/single_copy.h). Read once per process.
uint64_t shmSingleCopyBytes();

// A job id is a plain name: no '/', not "." or "..", at most 128 characters.
bool validJobId(const std::string& id);
// A fresh 12-hex-digit job id (as hetobs.config generates).
std::string generateJobId();
// For entry points with no rendezvous to agree on rank 0's id (the NCCL interposer): an id
// every rank of one launch derives alike from MASTER_ADDR:MASTER_PORT, which two jobs
// running at once on one machine cannot share. False when either is unset.
bool launchJobId(std::string* id);
// Where this rank's listeners bind: HETOBS_SOCKET_IFNAME's address, else the route toward
// MASTER_ADDR, else 0.0.0.0 (net.h listenAddressFor). Throws Error naming the setting.
std::string listenAddressFromEnv();
// Apply HETOBS_DEBUG to the native logger.
void applyLogLevel(const EnvSettings& s);

// The runtime's part of the settings, for one rank of a world.
RuntimeConfig runtimeConfigFrom(const EnvSettings& s, int rank, int worldSize);

}  // namespace hetobs
