// The watchdog thread: heartbeat, hang detection, and every queued dump request.
// It never takes the GIL and never waits on a communicator: it reads atomics.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "hetobs/common/wire.h"
#include "hetobs/observe/observed.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/observe/state_json.h"
#include "hetobs/record/recorder.h"

namespace hetobs {
namespace {
constexpr int64_t kOversleepNs = 1000000000;  // a poll this late past its tick: the process did not run
}  // namespace

void Runtime::watchdogLoop() {
  // Signals meant for Python's stack dumper or the user's dump signal go to other threads.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  // A tenth of the shortest stall the watchdog acts on: the suspicion floor or the hang timeout.
  int64_t shortest = std::min(secondsToNs(cfg_.hang_timeout_s), secondsToNs(suspect_.floor_s));
  int64_t tickNs = std::clamp<int64_t>(shortest / 10, 10000000, 500000000);
  // The verbose bandwidth log drains the record ring: tick often enough not to lose lines.
  if (bwLog_ && bwLog_->enabled()) tickNs = std::min<int64_t>(tickNs, 100000000);
  for (;;) {
    pollfd p{wakeFd_, POLLIN, 0};
    int64_t slept = monoNs();
    poll(&p, 1, int(tickNs / 1000000));
    // Woke far past the tick: this process was stopped (SIGSTOP, a frozen host) or not run. Its
    // ops' quiet time up to now tells nothing of its peers: a rank resumed from a stop would
    // otherwise suspect (and learn) its own freeze. The fixed timeout still counts it all.
    if (monoNs() - slept > tickNs + kOversleepNs) resumedAtNs_ = monoNs();
    uint64_t signals = 0;
    if (p.revents & POLLIN) {
      ssize_t rc = read(wakeFd_, &signals, sizeof signals);
      (void)rc;
    }
    stats_->header()->heartbeat_ns.store(wallNs(), std::memory_order_relaxed);
    if (exited_.load()) continue;
    // A dump signal wakes us through the eventfd without a queued request.
    std::deque<DumpRequest> work;
    {
      std::lock_guard<std::mutex> g(mu_);
      work.swap(queue_);
    }
    size_t queued = work.size();
    if (signals > queued && cfg_.dump_signal > 0) {
      DumpRequest req;
      req.incident = strFormat("signal-r%d-%lld", cfg_.rank, (long long)(wallNs() / 1000000));
      req.reason = "signal";
      req.cause = strFormat("signal %d received", cfg_.dump_signal);
      work.push_back(req);
    }
    for (auto& req : work) dump(req);
    checkHangs();
    startOverdueJoins();
    sampleLinkHealthWhenDue();
    if (bwLog_) bwLog_->poll(monoNs());
  }
}

// Live readers (exporter, `hetobs top`) see link health at most this old.
constexpr int64_t kLinkHealthIntervalNs = 1000000000;

void Runtime::sampleLinkHealthWhenDue() {
  int64_t now = monoNs();
  if (now - lastHealthSampleNs_ < kLinkHealthIntervalNs) return;
  lastHealthSampleNs_ = now;
  for (auto& comm : comms()) comm->sampleLinkHealth();
}

namespace {

// How many ops of its kind the communicator has issued up to and including this one: its
// collective seq, or its p2p seq for a p2p op (stall_history.h; the record carries the one).
uint64_t opIndex(const OpRecord& r) { return r.coll_seq + r.p2p_seq; }

}  // namespace

std::string hangIncidentId(const OpRecord& r, int rank) {
  return isP2P(OpKind(r.op))
             ? strFormat("hang-c%llu-p%llu-r%d", (unsigned long long)r.comm_id, (unsigned long long)r.p2p_seq, rank)
             : strFormat("hang-c%llu-s%llu", (unsigned long long)r.comm_id, (unsigned long long)r.coll_seq);
}

DumpRequest Runtime::hangRequest(const Observed::InFlight& f, const OpRecord& r, const std::string& what) const {
  bool p2p = isP2P(OpKind(r.op));
  DumpRequest req;
  req.incident = hangIncidentId(r, cfg_.rank);
  req.reason = "watchdog";
  req.cause = what;
  req.cause_info.kind = "hang";
  req.cause_info.culprits = waitedRanks(f.waits);
  req.cause_info.reporter = cfg_.rank;
  req.cause_info.op = opName(OpKind(r.op));
  req.cause_info.seq = int64_t(p2p ? r.p2p_seq : r.coll_seq);
  if (p2p && f.waits.size() == 1) req.cause_info.peer = f.waits[0].rank;
  req.ask_peers = true;
  req.hang_detected_ns = wallNs();
  return req;
}

void Runtime::checkHangs() {
  const int64_t now = monoNs();
  const int64_t limit = secondsToNs(cfg_.hang_timeout_s);  // inf: never a hang
  std::lock_guard<std::mutex> early(suspectMu_);
  std::set<uint64_t> live;
  for (auto& comm : comms()) {
    const uint64_t id = comm->observedId();
    live.insert(id);
    Observed::InFlight f;
    OpRecord r{};
    bool busy = comm->inFlight(&f) && Recorder::instance().get(f.record_id, &r);
    int64_t quiet = busy ? now - f.last_progress_ns : 0;
    int64_t early = busy ? now - std::max(f.last_progress_ns, resumedAtNs_) : 0;  // the early stage's quiet
    StallHistory& history = stalls_[id];
    StallHistory::Left left = history.look(busy, busy ? f.record_id : 0, busy ? opIndex(r) : 0, early, suspect_);
    if (left.left) opLeftFlight(id, history, left);
    if (!busy) continue;
    auto suspected = suspicions_.find(id);
    if (suspected != suspicions_.end() && suspected->second.record_id == f.record_id)
      suspected->second.stalled_ns = std::max(suspected->second.stalled_ns, early);
    bool p2p = isP2P(OpKind(r.op));
    if (quiet < limit) {
      int64_t threshold = history.thresholdNs(opIndex(r), suspect_);
      if (threshold < limit && early >= threshold) suspectHang(*comm, f, r, early, threshold, history);
      continue;
    }
    std::string what = strFormat("%s seq %llu on comm %llu: no progress for %.1f s (HETOBS_HANG_TIMEOUT=%g), waiting on %s",
                                 opName(OpKind(r.op)), (unsigned long long)(p2p ? r.p2p_seq : r.coll_seq),
                                 (unsigned long long)r.comm_id, double(quiet) / 1e9, cfg_.hang_timeout_s,
                                 f.waiting_on.empty() ? "no peer (local)" : f.waiting_on.c_str());
    if (confirmSuspicion(*comm, f.record_id, what)) continue;
    std::string incident = hangIncidentId(r, cfg_.rank);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!hangsReported_.insert(incident).second) continue;  // this hang is already on record
      hangsOrder_.push_back(incident);
      forgetOldIncidents();
    }
    HETOBS_WARN("hang detected: %s; dumping incident %s", what.c_str(), incident.c_str());
    stats_->header()->hangs_detected.fetch_add(1);
    DumpRequest req = hangRequest(f, r, what);
    // A collective's hang is seen by many ranks at once: they join one spread. A p2p
    // incident is this rank's alone; with abort_on_hang the dump must be written before
    // the abort, not when a spread arrives.
    if (!p2p && !cfg_.abort_on_hang) joinOrStartSpread(req);
    else dump(req);
    // Another rank suspected it early: its incident is confirmed now.
    if (access(jobDir_.incidentStateFile(incident, "suspected").c_str(), F_OK) == 0)
      writeConfirmed(incident, quiet, -1);
    if (cfg_.abort_on_hang) comm->requestAbort(what);
  }
  // Communicators gone since: their history and suspicions go with them.
  for (auto it = stalls_.begin(); it != stalls_.end();) it = live.count(it->first) ? std::next(it) : stalls_.erase(it);
  for (auto it = suspicions_.begin(); it != suspicions_.end();) {
    if (live.count(it->first)) {
      ++it;
      continue;
    }
    endSuspicion(it->second);
    it = suspicions_.erase(it);
  }
}

}  // namespace hetobs
