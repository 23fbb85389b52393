// Suspected hangs (docs/early-hangs.md): the watchdog's early stage. An op quiet far past what
// its communicator has shown is dumped job-wide at once and its incident marked suspected;
// nothing is done to the job. When the op completes, the incident is marked resolved (slow,
// not hung); when HETOBS_HANG_TIMEOUT passes, the same incident is marked confirmed.
//
// The marks are small files beside the incident's dumps (incidents/<id>/{suspected,resolved,
// confirmed}.json, docs/dump-schema.md "Incident state"), each created once, by the first rank
// to get there, so ranks never overwrite each other's word. Watchdog thread only.
#include <algorithm>
#include <functional>

#include <unistd.h>

#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/json.h"
#include "hetobs/common/log.h"
#include "hetobs/common/wire.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/record/recorder.h"

namespace hetobs {
namespace {

std::string stateJson(const char* state, const std::string& job, const std::string& incident, int rank,
                      const std::function<void(JsonWriter&)>& more) {
  JsonWriter w;
  w.beginObject();
  w.field("schema", "hetobs.incident_state").field("version", "1.0");
  w.field("state", state).field("job", job).field("incident", incident).field("rank", rank);
  w.field("time_ns", wallNs());
  more(w);
  w.endObject();
  return w.take();
}

void writeSuspectFields(JsonWriter& w, const SuspectInfo& s) {
  w.field("quiet_s", s.quiet_s).field("threshold_s", s.threshold_s).field("longest_wait_s", s.longest_wait_s);
  w.field("learned_ops", s.learned_ops);
}

}  // namespace

void Runtime::writeIncidentState(const std::string& incident, const char* state, const std::string& json) {
  if (!jobDir_.usable()) return;
  try {
    jobDir_.writeIncidentState(incident, state, json);  // false: another rank marked it first
  } catch (const std::exception& e) {
    HETOBS_WARN("cannot mark incident %s %s: %s", incident.c_str(), state, e.what());
  }
}

void Runtime::suspectHang(Observed& comm, const Observed::InFlight& f, const OpRecord& r, int64_t quietNs,
                          int64_t thresholdNs, const StallHistory& h) {
  bool p2p = isP2P(OpKind(r.op));
  Suspicion s;
  s.incident = hangIncidentId(r, cfg_.rank);
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!hangsReported_.insert(s.incident).second) return;  // suspected (or dumped as a hang) already
    hangsOrder_.push_back(s.incident);
    forgetOldIncidents();
  }
  s.record_id = f.record_id;
  s.suspected_wall_ns = wallNs();
  s.info.on = true;
  s.info.quiet_s = double(quietNs) / 1e9;
  s.info.threshold_s = double(thresholdNs) / 1e9;
  s.info.longest_wait_s = double(h.longestNs()) / 1e9;
  s.info.learned_ops = h.learned();
  s.op = opName(OpKind(r.op));
  s.seq = int64_t(p2p ? r.p2p_seq : r.coll_seq);
  s.comm_id = r.comm_id;
  s.stalled_ns = quietNs;
  suspicions_[comm.observedId()] = s;
  stats_->header()->hangs_suspected.fetch_add(1);
  std::string what = strFormat(
      "%s seq %lld on comm %llu: no progress for %.1f s, past %.1f s (HETOBS_SUSPECT_FACTOR=%g x the longest wait "
      "seen in %llu ops, %.2f s; floor HETOBS_SUSPECT_FLOOR=%g s): suspected hang, the job goes on "
      "(HETOBS_HANG_TIMEOUT=%g confirms), waiting on %s",
      s.op.c_str(), (long long)s.seq, (unsigned long long)r.comm_id, s.info.quiet_s, s.info.threshold_s,
      suspect_.factor, (unsigned long long)s.info.learned_ops, s.info.longest_wait_s, suspect_.floor_s,
      cfg_.hang_timeout_s, f.waiting_on.empty() ? "no peer (local)" : f.waiting_on.c_str());
  HETOBS_WARN("suspected hang: %s; dumping incident %s", what.c_str(), s.incident.c_str());
  DumpRequest req = hangRequest(f, r, what);
  req.suspect = s.info;
  // Marked before the spread starts, so every rank's dump lands in an incident that says so.
  writeIncidentState(s.incident, "suspected", stateJson("suspected", cfg_.job, s.incident, cfg_.rank, [&](JsonWriter& w) {
    w.field("comm_id", s.comm_id).field("op", s.op).field("seq", s.seq);
    writeSuspectFields(w, s.info);
    w.field("factor", suspect_.factor).field("floor_s", suspect_.floor_s);
    w.field("history_ops", suspect_.history_ops).field("hang_timeout_s", cfg_.hang_timeout_s);
    w.key("waiting_on").beginArray();
    for (int x : req.cause_info.culprits) w.value(x);
    w.endArray();
  }));
  // Never aborted, whatever HETOBS_ABORT_ON_HANG says: only the confirmation may touch the job.
  if (!p2p) joinOrStartSpread(req);
  else dump(req);
}

void Runtime::opLeftFlight(uint64_t commId, StallHistory& h, const StallHistory::Left& left) {
  OpRecord done{};
  bool known = Recorder::instance().get(left.record_id, &done);
  // A record already overwritten (a fast loop wraps the ring within a tick) was finished.
  if ((!known || OpState(done.state) == OpState::kCompleted) && left.teaches) h.learn(left.longest_quiet_ns);
  auto it = suspicions_.find(commId);
  if (it == suspicions_.end() || it->second.record_id != left.record_id) return;
  it->second.stalled_ns = std::max(it->second.stalled_ns, left.longest_quiet_ns);
  endSuspicion(it->second);
  suspicions_.erase(it);
}

void Runtime::endSuspicion(const Suspicion& s) {
  if (s.confirmed) return;  // a confirmed hang stays one
  OpRecord done{};
  bool known = Recorder::instance().get(s.record_id, &done);
  OpState state = known ? OpState(done.state) : OpState::kCompleted;  // overwritten: it had finished
  if (state == OpState::kFailed) {
    HETOBS_WARN("suspected hang %s: the op failed (%s); its error dump tells why", s.incident.c_str(), done.error);
    return;
  }
  if (state != OpState::kCompleted) return;  // still running as its communicator went away: no word
  // Another rank's watchdog reached HETOBS_HANG_TIMEOUT first: a confirmed hang stays one.
  if (access(jobDir_.incidentStateFile(s.incident, "confirmed").c_str(), F_OK) == 0) {
    HETOBS_WARN("suspected hang %s: the op completed after the hang was confirmed", s.incident.c_str());
    return;
  }
  stats_->header()->hangs_resolved.fetch_add(1);
  double duration = known && done.t_end_ns && done.t_start_ns ? double(done.t_end_ns - done.t_start_ns) / 1e9 : -1;
  HETOBS_WARN("suspected hang %s resolved: %s seq %lld completed, slow, not hung (no progress for at least %.1f s%s)",
              s.incident.c_str(), s.op.c_str(), (long long)s.seq, double(s.stalled_ns) / 1e9,
              duration >= 0 ? strFormat("; the op took %.1f s", duration).c_str() : "");
  writeIncidentState(s.incident, "resolved", stateJson("resolved", cfg_.job, s.incident, cfg_.rank, [&](JsonWriter& w) {
    w.field("comm_id", s.comm_id).field("op", s.op).field("seq", s.seq);
    w.field("suspected_ns", s.suspected_wall_ns);
    // The longest time without progress the watchdog saw (to a tick), and the op's own length.
    w.field("stalled_s", double(s.stalled_ns) / 1e9);
    if (duration >= 0) w.field("duration_s", duration);
    else w.nullField("duration_s");
    w.field("verdict", "slow, not hung");
  }));
}

void Runtime::endSuspicionsAtExit() {
  std::lock_guard<std::mutex> g(suspectMu_);
  for (auto& [comm, s] : suspicions_) endSuspicion(s);
  suspicions_.clear();
}

bool Runtime::confirmSuspicion(Observed& comm, uint64_t recordId, const std::string& what) {
  auto it = suspicions_.find(comm.observedId());
  if (it == suspicions_.end() || it->second.record_id != recordId) return false;
  Suspicion& s = it->second;
  if (s.confirmed) return true;
  s.confirmed = true;
  HETOBS_WARN("hang confirmed: %s; incident %s (suspected %.1f s ago) is a hang", what.c_str(), s.incident.c_str(),
              double(wallNs() - s.suspected_wall_ns) / 1e9);
  stats_->header()->hangs_detected.fetch_add(1);
  Observed::InFlight f;
  int64_t quiet = comm.inFlight(&f) ? monoNs() - f.last_progress_ns : 0;
  writeConfirmed(s.incident, quiet, s.suspected_wall_ns);
  if (cfg_.abort_on_hang) comm.requestAbort(what);
  return true;
}

void Runtime::writeConfirmed(const std::string& incident, int64_t quietNs, int64_t suspectedWallNs) {
  writeIncidentState(incident, "confirmed", stateJson("confirmed", cfg_.job, incident, cfg_.rank, [&](JsonWriter& w) {
    w.field("quiet_s", double(quietNs) / 1e9).field("hang_timeout_s", cfg_.hang_timeout_s);
    if (suspectedWallNs > 0) w.field("suspected_ns", suspectedWallNs);
    else w.nullField("suspected_ns");
  }));
}

}  // namespace hetobs
