// The watchdog thread: heartbeat, hang detection, and every queued dump request.
// It never takes the GIL and never waits on a communicator: it reads atomics.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "hetobs/common/wire.h"
#include "hetobs/observe/observed.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/observe/state_json.h"
#include "hetobs/record/recorder.h"

namespace hetobs {

void Runtime::watchdogLoop() {
  // Signals meant for Python's stack dumper or the user's dump signal go to other threads.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  int64_t tickNs = std::clamp<int64_t>(secondsToNs(cfg_.hang_timeout_s) / 10, 10000000, 500000000);
  // The verbose bandwidth log drains the record ring: tick often enough not to lose lines.
  if (bwLog_ && bwLog_->enabled()) tickNs = std::min<int64_t>(tickNs, 100000000);
  for (;;) {
    pollfd p{wakeFd_, POLLIN, 0};
    poll(&p, 1, int(tickNs / 1000000));
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

void Runtime::checkHangs() {
  const int64_t now = monoNs();
  const int64_t limit = secondsToNs(cfg_.hang_timeout_s);  // inf: never a hang
  for (auto& comm : comms()) {
    Observed::InFlight f;
    if (!comm->inFlight(&f)) continue;
    int64_t quiet = now - f.last_progress_ns;
    if (quiet < limit) continue;
    OpRecord r{};
    if (!Recorder::instance().get(f.record_id, &r)) continue;
    bool p2p = isP2P(OpKind(r.op));
    std::string incident =
        p2p ? strFormat("hang-c%llu-p%llu-r%d", (unsigned long long)r.comm_id, (unsigned long long)r.p2p_seq, cfg_.rank)
            : strFormat("hang-c%llu-s%llu", (unsigned long long)r.comm_id, (unsigned long long)r.coll_seq);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!hangsReported_.insert(incident).second) continue;  // this hang is already on record
      hangsOrder_.push_back(incident);
      forgetOldIncidents();
    }
    std::string what = strFormat("%s seq %llu on comm %llu: no progress for %.1f s (HETOBS_HANG_TIMEOUT=%g), waiting on %s",
                                 opName(OpKind(r.op)), (unsigned long long)(p2p ? r.p2p_seq : r.coll_seq),
                                 (unsigned long long)r.comm_id, double(quiet) / 1e9, cfg_.hang_timeout_s,
                                 f.waiting_on.empty() ? "no peer (local)" : f.waiting_on.c_str());
    HETOBS_WARN("hang detected: %s; dumping incident %s", what.c_str(), incident.c_str());
    stats_->header()->hangs_detected.fetch_add(1);
    DumpRequest req;
    req.incident = incident;
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
    // A collective's hang is seen by many ranks at once: they join one spread. A p2p
    // incident is this rank's alone; with abort_on_hang the dump must be written before
    // the abort, not when a spread arrives.
    if (!p2p && !cfg_.abort_on_hang) joinOrStartSpread(req);
    else dump(req);
    if (cfg_.abort_on_hang) comm->requestAbort(what);
  }
}

}  // namespace hetobs
