#pragma once
// The HETOBS_* settings read from the environment by native entry points that have no
// Python (the MPI and NCCL interposers) and by the core itself. Every read goes through
// kSettings, which is generated at build time from hetobs/settings_table.py (the one source:
// names, kinds, defaults, bounds, choices), so this parser and hetobs/config.py read alike:
// an invalid value is one message naming the variable, e.g. "HETOBS_RECORDS='abc': expected
// a number".
#include <cstddef>
#include <cstdint>
#include <string>

#include "hetobs/observe/stall_history.h"

#include "hetobs/observe/runtime.h"

namespace hetobs {

// Filled by readEnvSettings from kSettings; the defaults live in the table only, so the
// members here are plain zeros until read.
struct EnvSettings {
  std::string job_id;
  bool job_id_generated = false;  // none of HETOBS_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID was set
  std::string dir;
  std::string transport;  // auto | shm | tcp
  std::string secret;
  double timeout = 0;
  double connect_timeout = 0;
  uint32_t records = 0;
  double hang_timeout = 0;
  bool watchdog = false;
  bool abort_on_hang = false;
  int dump_signal = 0;  // 0: off
  uint64_t small_bytes = 0;
  std::string debug;  // ERROR | WARN | INFO | DEBUG
  double otel_sample = 0;
  std::string bw_log;  // off | verbose | agg
  double bw_log_interval = 0;
  std::string bw_log_file;
};

// How a setting is read (hetobs/settings_table.py's kinds): float takes inf ("never", for
// timeouts) and refuses NaN; int is bounded by minimum and maximum; choice and flag are one of
// `choices` (stripped, lower-cased); signal a name or number; text is taken as given.
enum class SettingKind : uint8_t { kFloat = 0, kInt, kChoice, kFlag, kSignal, kText };
const char* settingKindName(SettingKind k);  // "float", "int", ... as in settings_table.py

struct SettingSpec {
  const char* name;
  SettingKind kind;
  const char* dflt;     // the value read when unset
  double minimum;       // float and int
  long long maximum;    // int
  const char* choices;  // choice and flag: comma-separated
};
// Every HETOBS_* setting, in the README's order (generated: settings_table.inc).
extern const SettingSpec kSettings[];
extern const size_t kSettingCount;
// The row of `name`; nullptr when the table has none (a bug in the caller, not the user's).
const SettingSpec* findSetting(const char* name);

// A text setting's value (its default when unset), through the table.
std::string textSetting(const char* name);
// Any one setting as this parser reads it from the environment, as text (float "%.17g", int,
// choice lower-cased, flag "1"/"0", signal its number, text as given). False with *error (the
// message that names the variable and the value) when the value cannot be used. For tests that
// hold both parsers side by side; never throws.
bool readSetting(const char* name, std::string* value, std::string* error);

// Read every setting from the process environment (getenv). Returns false and sets
// *error (one line, no trailing newline) when a value cannot be used; never throws.
bool readEnvSettings(EnvSettings* out, std::string* error);

// Connection settings every connect path reads (read once per process).
struct NetSettings {
  int connect_retries = 0;      // HETOBS_CONNECT_RETRIES: attempts per connect
  double reconnect_timeout = 0;  // HETOBS_RECONNECT_TIMEOUT: seconds to re-make a broken link (inf: never give up)
};
NetSettings netSettings();
// HETOBS_SUSPECT_*: the watchdog's early stage (observe/stall_history.h). Read once per process;
// a bad value falls back to the table's default with a warning (Python refused it first).
SuspectSettings suspectSettings();
// HETOBS_SHM_SINGLE_COPY_BYTES: shared-memory messages from this size are read straight out of
// the sender's buffer (transport/shm/single_copy.h). Read once per process.
uint64_t shmSingleCopyBytes();
// HETOBS_DIGEST*: result digests compared across ranks (collectives/digest.h), and the test-only
// HETOBS_TEST_FLIP_BIT. Read once per process (a bad value is logged and the default kept).
struct DigestSettings {
  bool on = false;
  uint64_t every = 32;     // check sequence ids that are multiples of this (1 / HETOBS_DIGEST_RATE)
  bool raise = true;       // HETOBS_DIGEST_ACTION=raise
  int64_t flip_seq = -1;   // HETOBS_TEST_FLIP_BIT: the op (-1: off), element, bit
  uint64_t flip_element = 0;
  uint32_t flip_bit = 0;
};
const DigestSettings& digestSettings();

// A job id is a plain name: no '/', not "." or "..", at most 128 characters.
bool validJobId(const std::string& id);
// A fresh 12-hex-digit job id (as hetobs.config generates).
std::string generateJobId();
// For entry points with no rendezvous to agree on rank 0's id (the NCCL interposer): an id
// every rank of one launch derives alike from MASTER_ADDR:MASTER_PORT, which two jobs
// running at once on one machine cannot share. False when either is unset.
bool launchJobId(std::string* id);
// HETOBS_SOCKET_IFNAME and MASTER_ADDR are read here only, and the interface syntax parsed in
// one place (net.h interfaceAddress), for every entry point:
// Where this rank's listeners bind: HETOBS_SOCKET_IFNAME's address, else the route toward
// MASTER_ADDR, else 0.0.0.0 (net.h listenAddressFor). Throws Error naming the setting.
std::string listenAddressFromEnv();
// The address an interposer's side channel binds and advertises in its card (never the
// wildcard: peers dial it): HETOBS_SOCKET_IFNAME's, else the route toward MASTER_ADDR, else
// the default route's, else the first interface that is up (net.h outwardAddress). Throws
// Error naming the setting when HETOBS_SOCKET_IFNAME matches nothing.
std::string advertisedAddressFromEnv();
// Apply HETOBS_DEBUG to the native logger.
void applyLogLevel(const EnvSettings& s);

// The runtime's part of the settings, for one rank of a world.
RuntimeConfig runtimeConfigFrom(const EnvSettings& s, int rank, int worldSize);

}  // namespace hetobs
