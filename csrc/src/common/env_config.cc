#include "hetobs/common/env_config.h"
#include "hetobs/common/net.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"
#include "hetobs/common/log.h"

namespace hetobs {
namespace {

struct BadSetting {
  std::string message;
};

std::string env(const char* name, const char* dflt, bool* set = nullptr) {
  const char* v = getenv(name);
  if (set) *set = v != nullptr;
  return v ? std::string(v) : std::string(dflt);
}

std::string strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Python's repr() of a str, for messages that read like hetobs.config's.
std::string pyRepr(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\\' || c == '\'') out += '\\';
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out + "'";
}

[[noreturn]] void bad(const char* name, const std::string& raw, const std::string& why) {
  throw BadSetting{std::string(name) + "=" + pyRepr(raw) + ": " + why};
}

// Underscores as Python allows them in numbers: single, between two digits.
bool dropUnderscores(const std::string& in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '_') {
      *out += in[i];
      continue;
    }
    if (i == 0 || i + 1 >= in.size() || !std::isdigit(static_cast<unsigned char>(in[i - 1])) ||
        !std::isdigit(static_cast<unsigned char>(in[i + 1])))
      return false;
  }
  return true;
}

// float(raw) as Python parses it: decimal or inf/nan, optional sign, surrounding blanks.
bool parseFloat(const std::string& raw, double* v) {
  std::string s;
  if (!dropUnderscores(strip(raw), &s) || s.empty()) return false;
  std::string l = lower(s);
  if (l.find('x') != std::string::npos || l.find('(') != std::string::npos) return false;  // no hex, no nan(...)
  char* end = nullptr;
  errno = 0;
  double d = strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0') return false;
  *v = d;
  return true;
}

// int(raw) as Python parses it (decimal digits, optional sign, surrounding blanks).
bool parseInt(const std::string& raw, long long* v, bool* overflow) {
  std::string s;
  *overflow = false;
  if (!dropUnderscores(strip(raw), &s) || s.empty()) return false;
  size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0;
  if (i >= s.size()) return false;
  for (size_t k = i; k < s.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(s[k]))) return false;
  errno = 0;
  *v = strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE) *overflow = true;
  return true;
}

std::string fmtMin(double m, bool integer) {
  if (integer) return std::to_string((long long)m);
  std::string s = strFormat("%.15g", m);
  if (s.find('.') == std::string::npos && s.find('e') == std::string::npos) s += ".0";
  return s;
}

// The row of `name`, which must be of `kind`: a mismatch is a bug here, not the user's.
const SettingSpec& settingRow(const char* name, SettingKind kind) {
  const SettingSpec* s = findSetting(name);
  if (!s) throw BadSetting{std::string(name) + ": not in the settings table (hetobs/settings_table.py)"};
  if (s->kind != kind)
    throw BadSetting{std::string(name) + ": read as " + settingKindName(kind) + " but the settings table says " +
                     settingKindName(s->kind)};
  return *s;
}

// inf means "never" (every deadline saturates, see clock.h); NaN compares false with
// every bound, so it is refused by name rather than slipping past the minimum.
double numberSetting(const char* name) {
  const SettingSpec& spec = settingRow(name, SettingKind::kFloat);
  std::string raw = env(name, spec.dflt);
  double v = 0;
  if (!parseFloat(raw, &v)) bad(name, raw, "expected a number");
  if (std::isnan(v)) bad(name, raw, "expected a number, not NaN");
  if (v < spec.minimum) bad(name, raw, "must be at least " + fmtMin(spec.minimum, false));
  return v;
}

long long intSetting(const char* name) {
  const SettingSpec& spec = settingRow(name, SettingKind::kInt);
  std::string raw = env(name, spec.dflt);
  long long v = 0;
  bool overflow = false;
  const long long minimum = (long long)spec.minimum, maximum = spec.maximum;
  if (!parseInt(raw, &v, &overflow)) bad(name, raw, "expected a number");
  // strtoll saturates on overflow: LLONG_MIN below, LLONG_MAX above, each past its bound.
  if (v < minimum) bad(name, raw, "must be at least " + std::to_string(minimum));
  if (overflow || v > maximum) bad(name, raw, "must be at most " + std::to_string(maximum));
  return v;
}

namespace {

// A setting read where a bad value must not stop the process (the transport, the watchdog):
// the table's default instead (valid: tests/test_settings_table.py), with a warning naming it.
double numberOrDefault(const char* name) {
  try {
    return numberSetting(name);
  } catch (const BadSetting& b) {
    double v = strtod(settingRow(name, SettingKind::kFloat).dflt, nullptr);
    HETOBS_WARN("%s; using %g", b.message.c_str(), v);
    return v;
  }
}

long long intOrDefault(const char* name) {
  try {
    return intSetting(name);
  } catch (const BadSetting& b) {
    long long v = strtoll(settingRow(name, SettingKind::kInt).dflt, nullptr, 10);
    HETOBS_WARN("%s; using %lld", b.message.c_str(), v);
    return v;
  }
}

}  // namespace

std::string oneOf(const SettingSpec& spec) {
  std::string raw = env(spec.name, spec.dflt);
  std::string v = lower(strip(raw));
  std::string all;
  for (const char* c = spec.choices; *c;) {
    const char* end = strchr(c, ',');
    std::string choice = end ? std::string(c, size_t(end - c)) : std::string(c);
    if (v == choice) return v;
    all += (all.empty() ? "" : ", ") + choice;
    c = end ? end + 1 : c + choice.size();
  }
  bad(spec.name, raw, "expected one of " + all);
}

std::string choiceSetting(const char* name) { return oneOf(settingRow(name, SettingKind::kChoice)); }

bool flagSetting(const char* name) {
  std::string v = oneOf(settingRow(name, SettingKind::kFlag));
  return v == "1" || v == "true";
}

struct SignalName {
  const char* name;
  int num;
};

int signalSetting(const char* name) {
  std::string raw = strip(env(name, settingRow(name, SettingKind::kSignal).dflt));
  std::string l = lower(raw);
  if (l.empty() || l == "off" || l == "0" || l == "none") return 0;
  int num = 0;
  bool digits = true;
  for (char c : raw) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (digits) {
    num = raw.size() > 6 ? -1 : atoi(raw.c_str());
  } else {
    static const SignalName kSignals[] = {
        {"SIGHUP", SIGHUP},       {"SIGINT", SIGINT},       {"SIGQUIT", SIGQUIT},     {"SIGILL", SIGILL},
        {"SIGTRAP", SIGTRAP},     {"SIGABRT", SIGABRT},     {"SIGIOT", SIGIOT},       {"SIGBUS", SIGBUS},
        {"SIGFPE", SIGFPE},       {"SIGKILL", SIGKILL},     {"SIGUSR1", SIGUSR1},     {"SIGSEGV", SIGSEGV},
        {"SIGUSR2", SIGUSR2},     {"SIGPIPE", SIGPIPE},     {"SIGALRM", SIGALRM},     {"SIGTERM", SIGTERM},
        {"SIGSTKFLT", SIGSTKFLT}, {"SIGCHLD", SIGCHLD},     {"SIGCONT", SIGCONT},     {"SIGSTOP", SIGSTOP},
        {"SIGTSTP", SIGTSTP},     {"SIGTTIN", SIGTTIN},     {"SIGTTOU", SIGTTOU},     {"SIGURG", SIGURG},
        {"SIGXCPU", SIGXCPU},     {"SIGXFSZ", SIGXFSZ},     {"SIGVTALRM", SIGVTALRM}, {"SIGPROF", SIGPROF},
        {"SIGWINCH", SIGWINCH},   {"SIGIO", SIGIO},         {"SIGPOLL", SIGPOLL},     {"SIGPWR", SIGPWR},
        {"SIGSYS", SIGSYS},       {"SIGRTMIN", 0},          {"SIGRTMAX", 0},
    };
    std::string upper = raw;
    for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (upper.compare(0, 3, "SIG") != 0) upper = "SIG" + upper;
    bool found = false;
    for (const SignalName& s : kSignals) {
      if (upper == s.name) {
        num = s.num;
        if (upper == "SIGRTMIN") num = SIGRTMIN;
        if (upper == "SIGRTMAX") num = SIGRTMAX;
        found = true;
        break;
      }
    }
    if (!found) bad(name, raw, "not a signal name or number");
  }
  if (num == SIGKILL || num == SIGSTOP || num <= 0 || num >= NSIG) bad(name, raw, "cannot be caught");
  return num;
}

bool usableDir(const std::string& d) {
  struct stat st {};
  return !d.empty() && stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && access(d.c_str(), W_OK | X_OK) == 0;
}

// tempfile.gettempdir(): TMPDIR, TEMP, TMP, then the usual places, first usable one.
std::string tempDir() {
  for (const char* v : {"TMPDIR", "TEMP", "TMP"}) {
    const char* d = getenv(v);
    if (d && usableDir(d)) return d;
  }
  for (const char* d : {"/tmp", "/var/tmp", "/usr/tmp"})
    if (usableDir(d)) return d;
  char cwd[4096];
  if (getcwd(cwd, sizeof cwd)) return cwd;
  return "/tmp";
}

}  // namespace

// Generated from hetobs/settings_table.py (csrc/cmake/gen_settings.py); tests/test_settings_table.py
// compares this build's rows with the Python table row by row.
const SettingSpec kSettings[] = {
#include "hetobs/common/settings_table.inc"
};
const size_t kSettingCount = sizeof kSettings / sizeof kSettings[0];

const char* settingKindName(SettingKind k) {
  static const char* const kNames[] = {"float", "int", "choice", "flag", "signal", "text"};
  return uint8_t(k) < sizeof kNames / sizeof kNames[0] ? kNames[uint8_t(k)] : "invalid";
}

const SettingSpec* findSetting(const char* name) {
  for (const SettingSpec& s : kSettings)
    if (strcmp(s.name, name) == 0) return &s;
  return nullptr;
}

std::string textSetting(const char* name) {
  const SettingSpec* s = findSetting(name);
  if (!s || s->kind != SettingKind::kText) throw Error(std::string(name) + ": not a text setting of the table");
  return env(name, s->dflt);
}

// Read where a connection is made (any entry point, Python or not); hetobs/config.py has
// refused a bad value already when Python started the rank, so a bad one here falls back to
// the default with a warning instead of failing a connect.
NetSettings netSettings() {
  static const NetSettings cached = [] {
    NetSettings n;
    n.connect_retries = int(intOrDefault("HETOBS_CONNECT_RETRIES"));
    n.reconnect_timeout = numberOrDefault("HETOBS_RECONNECT_TIMEOUT");
    return n;
  }();
  return cached;
}

SuspectSettings suspectSettings() {
  static const SuspectSettings cached = [] {
    SuspectSettings v;
    v.factor = numberOrDefault("HETOBS_SUSPECT_FACTOR");
    v.floor_s = numberOrDefault("HETOBS_SUSPECT_FLOOR");
    v.history_ops = uint64_t(intOrDefault("HETOBS_SUSPECT_HISTORY"));
    return v;
  }();
  return cached;
}

const DigestSettings& digestSettings() {
  static const DigestSettings cached = [] {
    DigestSettings d;
    try {
      d.on = flagSetting("HETOBS_DIGEST");
      double rate = numberSetting("HETOBS_DIGEST_RATE");
      d.every = rate >= 1.0 ? 1 : rate <= 0.0 ? 0 : uint64_t(std::llround(1.0 / rate));
      if (d.every == 0) d.on = false;  // rate 0: nothing sampled
      d.raise = choiceSetting("HETOBS_DIGEST_ACTION") == "raise";
    } catch (const BadSetting& b) {
      HETOBS_WARN("%s; result digests off", b.message.c_str());
      d.on = false;
    }
    std::string flip = textSetting("HETOBS_TEST_FLIP_BIT");
    if (!flip.empty()) {
      unsigned long long seq = 0, element = 0;
      unsigned bit = 0;
      int got = sscanf(flip.c_str(), "%llu:%llu:%u", &seq, &element, &bit);
      if (got >= 1) {
        d.flip_seq = int64_t(seq);
        d.flip_element = element;
        d.flip_bit = bit;
      } else {
        HETOBS_WARN("HETOBS_TEST_FLIP_BIT='%s': expected SEQ[:ELEMENT[:BIT]]; ignored", flip.c_str());
      }
    }
    return d;
  }();
  return cached;
}

uint64_t shmSingleCopyBytes() {
  static const uint64_t cached = [] {
    return uint64_t(intOrDefault("HETOBS_SHM_SINGLE_COPY_BYTES"));
  }();
  return cached;
}

bool validJobId(const std::string& id) {
  return !id.empty() && id.find('/') == std::string::npos && id != "." && id != ".." && id.size() <= 128;
}

std::string generateJobId() {
  uint8_t b[6];
  randomBytes(b, sizeof b);
  std::string s;
  for (uint8_t x : b) s += strFormat("%02x", x);
  return s;
}

std::string listenAddressFromEnv() {
  return listenAddressFor(strip(textSetting("HETOBS_SOCKET_IFNAME")), strip(env("MASTER_ADDR", "")));
}

std::string advertisedAddressFromEnv() {
  std::string spec = strip(textSetting("HETOBS_SOCKET_IFNAME"));
  if (!spec.empty()) return interfaceAddress(spec);
  return outwardAddress(strip(env("MASTER_ADDR", "")));
}

bool launchJobId(std::string* id) {
  const char* addr = getenv("MASTER_ADDR");
  const char* port = getenv("MASTER_PORT");
  if (!addr || !*addr || !port || !*port) return false;
  std::string where = std::string(addr) + ":" + port;
  Digest d = hmacSha256("hetobs-launch", where.data(), where.size());
  std::string s = "launch-";
  for (int i = 0; i < 6; ++i) s += strFormat("%02x", d[size_t(i)]);
  *id = s;
  return true;
}

bool readSetting(const char* name, std::string* value, std::string* error) {
  try {
    const SettingSpec* s = findSetting(name);
    if (!s) throw BadSetting{std::string(name) + ": not in the settings table (hetobs/settings_table.py)"};
    switch (s->kind) {
      case SettingKind::kFloat:
        *value = strFormat("%.17g", numberSetting(name));
        break;
      case SettingKind::kInt:
        *value = std::to_string(intSetting(name));
        break;
      case SettingKind::kChoice:
        *value = choiceSetting(name);
        break;
      case SettingKind::kFlag:
        *value = flagSetting(name) ? "1" : "0";
        break;
      case SettingKind::kSignal:
        *value = std::to_string(signalSetting(name));
        break;
      case SettingKind::kText:
        *value = textSetting(name);
        break;
    }
    return true;
  } catch (const BadSetting& b) {
    if (error) *error = b.message;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
  }
  return false;
}

bool readEnvSettings(EnvSettings* out, std::string* error) {
  try {
    EnvSettings s;
    bool found = false;
    for (const char* name : {"HETOBS_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
      std::string v = strip(strcmp(name, "HETOBS_JOB_ID") == 0 ? textSetting(name) : env(name, ""));
      // torchrun's static rendezvous says "none" for every job: a placeholder, not an id.
      if (strcmp(name, "TORCHELASTIC_RUN_ID") == 0 && lower(v) == "none") continue;
      if (v.empty()) continue;
      if (strcmp(name, "SLURM_JOB_ID") == 0) {
        // One id per srun step (hetobs/config.py _job_id says the same): two steps of one
        // allocation never share a job directory. A batch script has no step.
        std::string step = strip(env("SLURM_STEP_ID", ""));
        if (step.empty()) step = strip(env("SLURM_STEPID", ""));
        if (!step.empty()) v += "." + step;
      }
      if (!validJobId(v)) bad(name, v, "a job id must be a plain name (no '/', at most 128 chars)");
      s.job_id = v;
      found = true;
      break;
    }
    if (!found) {
      s.job_id = generateJobId();
      s.job_id_generated = true;
    }
    s.dir = textSetting("HETOBS_DIR");
    if (s.dir.empty()) s.dir = tempDir() + "/hetobs-" + std::to_string(getuid());
    s.transport = choiceSetting("HETOBS_TRANSPORT");
    s.secret = textSetting("HETOBS_SECRET");
    s.timeout = numberSetting("HETOBS_TIMEOUT");
    s.connect_timeout = numberSetting("HETOBS_CONNECT_TIMEOUT");
    s.records = uint32_t(intSetting("HETOBS_RECORDS"));
    s.hang_timeout = numberSetting("HETOBS_HANG_TIMEOUT");
    s.watchdog = flagSetting("HETOBS_WATCHDOG");
    s.abort_on_hang = flagSetting("HETOBS_ABORT_ON_HANG");
    s.dump_signal = signalSetting("HETOBS_DUMP_SIGNAL");
    s.small_bytes = uint64_t(intSetting("HETOBS_SMALL_BYTES"));
    std::string dbg = choiceSetting("HETOBS_DEBUG");
    for (char& c : dbg) c = char(std::toupper(static_cast<unsigned char>(c)));
    s.debug = dbg;
    s.otel_sample = std::min(1.0, numberSetting("HETOBS_OTEL_SAMPLE"));
    s.bw_log = choiceSetting("HETOBS_BW_LOG");
    s.bw_log_interval = numberSetting("HETOBS_BW_LOG_INTERVAL");
    s.bw_log_file = textSetting("HETOBS_BW_LOG_FILE");
    intSetting("HETOBS_CONNECT_RETRIES");  // validated here for entry points without Python
    numberSetting("HETOBS_RECONNECT_TIMEOUT");
    numberSetting("HETOBS_SUSPECT_FACTOR");
    numberSetting("HETOBS_SUSPECT_FLOOR");
    intSetting("HETOBS_SUSPECT_HISTORY");
    *out = std::move(s);
    return true;
  } catch (const BadSetting& b) {
    if (error) *error = b.message;
  } catch (const std::exception& e) {
    if (error) *error = std::string("cannot read the HETOBS_* settings: ") + e.what();
  }
  return false;
}

void applyLogLevel(const EnvSettings& s) {
  static const char* kNames[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  for (int i = 0; i < 4; ++i)
    if (s.debug == kNames[i]) setLogLevel(LogLevel(i));
}

RuntimeConfig runtimeConfigFrom(const EnvSettings& s, int rank, int worldSize) {
  RuntimeConfig rc;
  rc.job = s.job_id;
  rc.dir = s.dir;
  rc.secret = s.secret;
  rc.rank = rank;
  rc.world_size = worldSize;
  rc.hang_timeout_s = s.hang_timeout;
  rc.abort_on_hang = s.abort_on_hang;
  rc.dump_signal = s.dump_signal;
  rc.records = s.records;
  rc.bw_log = s.bw_log;
  rc.bw_log_interval_s = s.bw_log_interval;
  rc.bw_log_file = s.bw_log_file;
  return rc;
}

}  // namespace hetobs
