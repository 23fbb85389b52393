#include "hetobs/observe/runtime.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "hetobs/observe/exit_signal.h"
#include "hetobs/observe/observed.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"
#include "hetobs/common/json.h"
#include "hetobs/common/log.h"
#include "hetobs/record/recorder.h"

namespace hetobs {
namespace {

std::atomic<Runtime*> gRuntime{nullptr};
std::mutex gInitMu;

// HETOBS_DUMP_SIGNAL: async-signal-safe handler that wakes the watchdog, then chains.
int gSignalWakeFd = -1;
struct sigaction gPrevAction;
void onDumpSignal(int sig, siginfo_t* info, void* ctx) {
  int saved = errno;
  uint64_t one = 1;
  if (gSignalWakeFd >= 0) {
    ssize_t rc = write(gSignalWakeFd, &one, sizeof one);
    (void)rc;
  }
  errno = saved;
  if (gPrevAction.sa_flags & SA_SIGINFO) {
    if (gPrevAction.sa_sigaction) gPrevAction.sa_sigaction(sig, info, ctx);
  } else if (gPrevAction.sa_handler != SIG_DFL && gPrevAction.sa_handler != SIG_IGN && gPrevAction.sa_handler) {
    gPrevAction.sa_handler(sig);
  }
}

// on_exit: the status passed to exit(), for this process only (a forked child inherits
// the registration, and its exit is not this rank's).
pid_t gExitPid = 0;
void onProcessExit(int status, void*) {
  if (getpid() != gExitPid) return;
  if (Runtime* r = Runtime::get()) {
    try {
      r->noteExitStatus(status & 0xff);  // what the parent sees: exit(256) is a 0
    } catch (...) {  // an exit must stay an exit
    }
  }
}

// A communicator holds a socket per peer it talks to, and the side channel more while a
// dump spreads: the default soft limit (1,024) breaks jobs near 1,000 ranks. Raise it to
// the hard limit; say once when even that looks too low for this world.
void raiseFileLimit(int worldSize) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {
    rlim_t old = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      HETOBS_WARN("cannot raise the open-file limit from %llu to its hard limit %llu: %s", (unsigned long long)old,
                  (unsigned long long)lim.rlim_max, errnoString(errno).c_str());
      lim.rlim_cur = old;
    }
  }
  rlim_t want = rlim_t(worldSize) * 2 + 256;  // a socket per peer on the world, plus room
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want)
    HETOBS_WARN("open-file limit %llu is low for %d ranks (want >= %llu): raise the hard limit (ulimit -Hn)",
                (unsigned long long)lim.rlim_cur, worldSize, (unsigned long long)want);
}

}  // namespace

Runtime* Runtime::get() { return gRuntime.load(std::memory_order_acquire); }

Runtime& Runtime::init(const RuntimeConfig& cfg) {
  std::lock_guard<std::mutex> g(gInitMu);
  if (Runtime* r = gRuntime.load()) return *r;
  // Leaked on purpose: ops and the watchdog may run until the very end of the process.
  auto* r = new Runtime(cfg);
  gRuntime.store(r, std::memory_order_release);
  return *r;
}

Runtime::Runtime(const RuntimeConfig& cfg) : cfg_(cfg), jobDir_(cfg.dir, cfg.job) {
  startWallNs_ = wallNs();
  suspect_ = suspectSettings();
  raiseFileLimit(cfg.world_size);
  host_ = localHostname();
  stats::SegmentConfig sc;
  sc.job = cfg.job;
  sc.rank = cfg.rank;
  sc.world_size = cfg.world_size;
  sc.host = host_;
  sc.hang_timeout_s = cfg.hang_timeout_s;
  sc.record_capacity = cfg.records ? cfg.records : 1;
  stats_ = stats::Segment::create(sc);
  segmentPath_ = stats_->path();
  Recorder::instance().attach(stats_->records(), sc.record_capacity, &stats_->header()->records_next);
  try {
    jobDir_.ensure();
  } catch (const Error& e) {
    if (jobDir_.usable()) HETOBS_WARN("job directory unusable, dumps will fail: %s", e.what());
    else HETOBS_WARN("%s", e.what());  // once: later writes are skipped without a word
  }
  try {
    bwLog_ = std::make_unique<BwLog>(parseBwLogMode(cfg.bw_log), cfg.bw_log_interval_s, cfg.bw_log_file, cfg.rank,
                                     host_);
  } catch (const Error& e) {
    HETOBS_WARN("%s; bandwidth log off", e.what());
  }
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (cfg.dump_signal > 0) {
    gSignalWakeFd = wakeFd_;
    struct sigaction sa {};
    sa.sa_sigaction = onDumpSignal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(cfg.dump_signal, &sa, &gPrevAction) != 0)
      HETOBS_WARN("cannot install HETOBS_DUMP_SIGNAL=%d: %s", cfg.dump_signal, errnoString(errno).c_str());
  }
  installExitSignalRecorder();
  startUnixSocket();
  watchdog_ = std::thread([this] { watchdogLoop(); });
  watchdog_.detach();
}

void Runtime::setWorld(const std::vector<Card>& cards) {
  {
    std::lock_guard<std::mutex> g(mu_);
    world_ = cards;
  }
  writeMetadata();
}

void Runtime::registerComm(const std::shared_ptr<Observed>& comm) {
  {
    std::lock_guard<std::mutex> g(mu_);
    comms_.push_back(comm);
  }
  if (!world_.empty()) writeMetadata();
}

std::vector<std::shared_ptr<Observed>> Runtime::comms() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::shared_ptr<Observed>> out;
  for (auto it = comms_.begin(); it != comms_.end();) {
    if (auto c = it->lock()) {
      out.push_back(c);
      ++it;
    } else {
      it = comms_.erase(it);
    }
  }
  return out;
}

void Runtime::setStackDumper(int signal, int fd) {
  std::lock_guard<std::mutex> g(dumpMu_);
  stackSignal_ = signal;
  stackFd_ = fd;
}

stats::CommStats* Runtime::commStats(std::unique_ptr<stats::CommStats>* fallback, uint64_t id, int size, int rank) {
  Runtime* rt = get();
  stats::CommStats* c = rt ? rt->stats().allocComm() : nullptr;
  if (!c) {
    *fallback = std::make_unique<stats::CommStats>();
    c = fallback->get();
  }
  c->comm_id = id;
  c->size = size;
  c->rank = rank;
  return c;
}

void Runtime::noteProgressAt(int64_t mono) {
  stats_->header()->last_progress_ns.store(monoToWallNs(mono), std::memory_order_relaxed);
}


void Runtime::writeMetadata() {
  JsonWriter w;
  std::vector<Card> world;
  {
    std::lock_guard<std::mutex> g(mu_);
    world = world_;
  }
  const Card* me = size_t(cfg_.rank) < world.size() ? &world[size_t(cfg_.rank)] : nullptr;
  w.beginObject();
  w.field("schema", "hetobs.rank").field("version", "2.0");
  w.field("job", cfg_.job).field("rank", cfg_.rank).field("world_size", cfg_.world_size);
  w.field("host", host_).field("host_key", localHostKey()).field("boot_id", localBootId());
  w.field("pid", int(getpid()));
  w.field("process_start_time", stats_->header()->process_start_ticks);
  w.field("start_time_ns", startWallNs_);
  w.key("side_channel").beginObject();
  w.field("ip", me ? me->ip : std::string("127.0.0.1")).field("port", me ? me->port : 0);
  w.endObject();
  w.field("control_socket", unixPath_);
  w.field("stats_segment", segmentPath_);  // not stats_->path(): that is cleared once the segment is removed
  w.field("hang_timeout_s", cfg_.hang_timeout_s);
  // After exit the communicators may be gone (Python has torn its objects down by the time
  // the exit status is known): the array is kept as it was last written while they lived.
  std::string commsJson;
  {
    std::lock_guard<std::mutex> g(mu_);
    commsJson = commsJson_;
  }
  if (!exited_.load() || commsJson.empty()) {
    JsonWriter cw;
    cw.beginArray();
    for (auto& c : comms()) c->writeMetadata(cw);
    cw.endArray();
    commsJson = cw.take();
    std::lock_guard<std::mutex> g(mu_);
    commsJson_ = commsJson;
  }
  w.key("comms").raw(commsJson);
  bool exited = exited_.load();
  std::string head = exited ? std::string() : w.str();  // what a death by signal would leave (exit_signal.h)
  w.field("exited_cleanly", exited && cleanExit_.load());
  if (exited) w.field("exit_time_ns", exitWallNs_.load());
  else w.nullField("exit_time_ns");
  int code = exitCode_.load();
  if (code >= 0) w.key("exit_status").beginObject().field("code", code).endObject();
  else w.nullField("exit_status");
  w.endObject();
  try {
    jobDir_.writeRankMetadata(cfg_.rank, w.str());
  } catch (const Error& e) {
    HETOBS_WARN("cannot write rank metadata: %s", e.what());
  }
  if (!exited && jobDir_.usable())
    publishSignalRecord(jobDir_.rankFile(cfg_.rank), head + ",\"exited_cleanly\":false,\"exit_time_ns\":",
                        ",\"exit_status\":{\"signal\":", "}}");
}

void Runtime::markExit(bool clean) {
  // A suspected op that completed since the watchdog's last tick: marked resolved now, or the
  // incident would say "suspected" for good (a job often ends right after its slow op).
  if (!exited_.load()) endSuspicionsAtExit();
  // A hang seen here whose spread has not reached us yet: write what this rank saw now
  // (the coordinator's spread covers the others), or it would be lost with the process.
  std::vector<DumpRequest> unreached;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [incident, join] : joins_) unreached.push_back(join.req);
    joins_.clear();
  }
  for (DumpRequest& req : unreached) {
    req.ask_peers = false;
    dump(req);
  }
  {
    // Let dumps being written finish: they are the evidence this exit may need.
    std::unique_lock<std::mutex> lk(mu_);
    for (auto& [incident, state] : dumped_)
      if (state == DumpState::kWriting) waitForDump(lk, incident, 2000000000LL);
  }
  if (exited_.exchange(true)) return;
  clearSignalRecord();  // from here on the exit status tells how it ended
  cleanExit_ = clean && exitCode_.load() <= 0;
  exitWallNs_ = wallNs();
  if (bwLog_) bwLog_->finish(monoNs());
  writeMetadata();
  stats_->markExited();
  if (!unixPath_.empty()) unlink(unixPath_.c_str());
  // Registered now, at the end of the process, so it runs first among exit()'s handlers,
  // before static objects registered earlier are destroyed.
  if (gExitPid == 0) {
    gExitPid = getpid();
    if (on_exit(onProcessExit, nullptr) != 0) HETOBS_WARN("cannot watch this process's exit status");
  }
}

void Runtime::noteExitStatus(int code) {
  if (exitCode_.exchange(code) == code) return;  // told twice (a second handler): nothing new
  if (!exited_.load()) {
    markExit(code == 0);
    return;
  }
  if (code != 0) cleanExit_ = false;
  writeMetadata();
}

void Runtime::forgetOldIncidents() {
  while (dumpedOrder_.size() > kIncidentsKept) {
    auto it = dumped_.find(dumpedOrder_.front());
    if (it != dumped_.end() && it->second == DumpState::kWriting) break;  // someone waits on it
    if (it != dumped_.end()) dumped_.erase(it);
    dumpedOrder_.pop_front();
  }
  while (hangsOrder_.size() > kIncidentsKept) {
    hangsReported_.erase(hangsOrder_.front());
    hangsOrder_.pop_front();
  }
}

std::string Runtime::newIncidentId(const char* kind) const {
  uint8_t r[2];
  randomBytes(r, sizeof r);
  return strFormat("%s-%lld-%02x%02x", kind, (long long)(wallNs() / 1000000), r[0], r[1]);
}

void Runtime::enqueue(DumpRequest req) {
  {
    std::lock_guard<std::mutex> g(mu_);
    queue_.push_back(std::move(req));
  }
  cv_.notify_all();
  uint64_t one = 1;
  ssize_t rc = write(wakeFd_, &one, sizeof one);
  (void)rc;
}

namespace {

// Lines of a control request after its verb: `count` fields, then the rest (the cause).
bool splitRequest(const std::string& request, size_t start, int count, std::vector<std::string>* parts,
                  std::string* rest) {
  for (int i = 0; i < count; ++i) {
    size_t nl = request.find('\n', start);
    if (nl == std::string::npos) return false;
    parts->push_back(request.substr(start, nl - start));
    start = nl + 1;
  }
  *rest = request.substr(start);
  return true;
}

// An incident id names a directory under incidents/: one path component, not hidden.
bool validIncidentId(const std::string& id) {
  return !id.empty() && id.find('/') == std::string::npos && id[0] != '.' && id.size() <= 128;
}

bool parseInt(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty() || s.size() > 20) return false;
  char* end = nullptr;
  errno = 0;
  long long v = strtoll(s.c_str(), &end, 10);
  if (errno || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

std::string Runtime::handleControl(const std::string& request) {
  // "dump\n<incident>\n<reason>\n<from rank>\n<cause>" (this rank only), or
  // "spread\n<incident>\n<reason>\n<from>\n<origin>\n<lo>\n<hi>\n<asked_ns>\n<cause>" (this rank
  // heads [lo, hi) of origin's spread, dump_tree.h), or
  // "start\n<incident>\n<reason>\n<from>\n<asked_ns>\n<cause>" (start the incident's one
  // spread from this rank, spread_join.cc), or "ping".
  if (request == "ping") return strFormat("pong %d %d", cfg_.rank, int(getpid()));
  if (request.compare(0, 6, "start\n") == 0) {
    std::vector<std::string> parts;
    DumpRequest req;
    if (!splitRequest(request, 6, 4, &parts, &req.cause)) return "error malformed start request";
    req.incident = parts[0];
    req.reason = parts[1];
    long long from, asked;
    if (!parseInt(parts[2], 0, cfg_.world_size - 1, &from)) return "error bad requesting rank";
    if (!parseInt(parts[3], 0, INT64_MAX, &asked)) return "error bad asked_ns";
    if (!validIncidentId(req.incident)) return "error bad incident id";
    if (req.reason != "peer_request") return "error bad reason";
    req.requested_by = int(from);
    req.asked_ns = asked;
    req.received_ns = wallNs();
    req.ask_peers = true;  // origin -1: this rank heads the whole world (dump.cc); once per incident
    enqueue(req);
    return strFormat("ok %d", cfg_.rank);
  }
  bool spread = request.compare(0, 7, "spread\n") == 0;
  if (spread || request.compare(0, 5, "dump\n") == 0) {
    std::vector<std::string> parts;
    DumpRequest req;
    if (!splitRequest(request, spread ? 7 : 5, spread ? 7 : 3, &parts, &req.cause))
      return "error malformed dump request";
    req.incident = parts[0];
    req.reason = parts[1];
    long long from = -1;  // -1: not a rank (hetobs dump --job, a tool)
    if (!parseInt(parts[2], -1, cfg_.world_size - 1, &from)) return "error bad requesting rank";
    req.requested_by = int(from);
    if (!validIncidentId(req.incident)) return "error bad incident id";
    if (req.reason != "peer_request" && req.reason != "on_demand") return "error bad reason";
    req.received_ns = wallNs();
    if (spread) {
      const int n = cfg_.world_size;
      long long origin, lo, hi, asked;
      if (!parseInt(parts[3], 0, n - 1, &origin) || !parseInt(parts[4], 0, n - 1, &lo) ||
          !parseInt(parts[5], lo + 1, n, &hi) || !parseInt(parts[6], 0, INT64_MAX, &asked))
        return "error bad spread fields (origin, lo, hi, asked_ns)";
      if (spreadRank(int(origin), int(lo), n) != cfg_.rank)
        return strFormat("error spread position %lld of origin %lld is not rank %d", lo, origin, cfg_.rank);
      req.origin = int(origin);
      req.interval = SpreadInterval{int(lo), int(hi)};
      req.asked_ns = asked;
      req.ask_peers = true;
    }
    enqueue(req);
    return strFormat("ok %d", cfg_.rank);
  }
  return "error unknown request";
}

bool Runtime::claimSpread(const DumpRequest& req) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = spreadOrigin_.find(req.incident);
  if (it == spreadOrigin_.end()) {
    spreadOrigin_.emplace(req.incident, req.origin);
    return true;
  }
  if (req.requested_by >= 0 && req.origin < it->second) {
    it->second = req.origin;
    return true;
  }
  return false;
}

}  // namespace hetobs
