// Writing one rank's dump (docs/dump-schema.md): native state first, then the
// Python stacks, collected time-boxed through faulthandler on a signal, so a dump
// never waits on the GIL and a stuck main thread still shows where it is.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "hetobs/common/wire.h"
#include "hetobs/observe/observed.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/json.h"
#include "hetobs/common/log.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/observe/state_json.h"
#include "hetobs/record/recorder.h"

namespace hetobs {
namespace {

constexpr int64_t kStacksWaitNs = 1000000000;  // give faulthandler at most this long
constexpr int64_t kStacksSettleNs = 30000000;  // output unchanged this long = finished
constexpr int64_t kDumpWaitNs = 5000000000LL;  // longest wait for another thread's dump of an incident

void writeEntry(JsonWriter& w, const OpRecord& r) {
  bool p2p = isP2P(OpKind(r.op));
  const char* op = opName(OpKind(r.op));
  const char* dt = dtypeName(DType(r.dtype));
  w.beginObject();
  w.field("record_id", r.record_id).field("pg_id", r.comm_id).field("comm_id", r.comm_id);
  w.field("collective_seq_id", r.coll_seq).field("p2p_seq_id", r.p2p_seq);
  w.field("profiling_name", std::string("hetobs:") + op).field("op", op);
  w.key("input_sizes").beginArray().beginArray().value(r.count).endArray().endArray();
  w.key("output_sizes").beginArray().beginArray().value(r.out_count).endArray().endArray();
  w.key("input_dtypes").beginArray().value(dt).endArray();
  w.key("output_dtypes").beginArray().value(dt).endArray();
  w.field("dtype", dt).field("count", r.count).field("out_count", r.out_count).field("bytes", r.bytes);
  OpKind k = OpKind(r.op);
  if (k == OpKind::kAllReduce || k == OpKind::kReduce || k == OpKind::kReduceScatter)
    w.field("reduction", redOpName(RedOp(r.redop)));
  else
    w.nullField("reduction");
  if (!p2p && r.root_or_peer >= 0) w.field("root", r.root_or_peer);
  else w.nullField("root");
  if (p2p) w.field("peer", r.root_or_peer);
  else w.nullField("peer");
  w.field("state", opStateName(OpState(r.state))).field("algorithm", algorithmName(Algorithm(r.algorithm)));
  w.field("backend", backendName(Backend(r.backend))).field("device_type", std::string(recordDevice(r)));
  if (r.library[0]) w.field("library", std::string(r.library));
  w.field("comm_size", r.comm_size).field("comm_rank", r.comm_rank);
  w.field("time_created_ns", monoToWallNs(r.t_enqueue_ns));
  if (r.t_start_ns) w.field("time_discovered_started_ns", monoToWallNs(r.t_start_ns));
  else w.nullField("time_discovered_started_ns");
  if (r.t_end_ns) w.field("time_discovered_completed_ns", monoToWallNs(r.t_end_ns));
  else w.nullField("time_discovered_completed_ns");
  if (r.t_end_ns && r.t_start_ns) w.field("duration_ms", double(r.t_end_ns - r.t_start_ns) / 1e6);
  else w.nullField("duration_ms");
  w.field("algbw_gbps", r.algbw_gbps).field("busbw_gbps", r.busbw_gbps);
  // Who arrived last (record/arrival.h), as this rank heard it; null where not known.
  if (r.arrival_flags & kArrivalKnown) {
    w.field("last_arrival_rank", r.last_arrival_rank).field("arrival_lag_ns", r.arrival_lag_ns);
    w.field("behind_first_ns", r.behind_first_ns).field("arrival_judged", (r.arrival_flags & kArrivalJudged) != 0);
  } else {
    w.nullField("last_arrival_rank").nullField("arrival_lag_ns").nullField("behind_first_ns").nullField("arrival_judged");
  }
  if (r.error[0]) w.field("error", std::string(r.error));
  else w.nullField("error");
  writeIslandFields(w, r, true);
  w.endObject();
}

void writeRanks(JsonWriter& w, const char* key, const std::vector<int>& v) {
  w.key(key).beginArray();
  for (int r : v) w.value(r);
  w.endArray();
}

}  // namespace

bool Runtime::waitForDump(std::unique_lock<std::mutex>& lk, const std::string& incident, int64_t timeoutNs) {
  return dumpedCv_.wait_for(lk, std::chrono::nanoseconds(timeoutNs), [&] {
    auto it = dumped_.find(incident);
    return it == dumped_.end() || it->second != DumpState::kWriting;
  });
}

std::string Runtime::collectStacks(std::string* status) {
  if (stackSignal_ <= 0 || stackFd_ < 0) {
    *status = "unavailable";
    return "";
  }
  if (ftruncate(stackFd_, 0) != 0 || lseek(stackFd_, 0, SEEK_SET) != 0) {
    *status = "error";
    return "";
  }
  if (kill(getpid(), stackSignal_) != 0) {
    *status = "error";
    return "";
  }
  int64_t start = monoNs(), lastChange = start;
  off_t lastSize = 0;
  for (;;) {
    usleep(5000);  // polling a file another thread writes from a signal handler: no event to wait on
    struct stat st {};
    fstat(stackFd_, &st);
    int64_t now = monoNs();
    if (st.st_size != lastSize) {
      lastSize = st.st_size;
      lastChange = now;
    }
    if (lastSize > 0 && now - lastChange >= kStacksSettleNs) break;
    if (now - start >= kStacksWaitNs) break;
  }
  std::string text(size_t(lastSize), '\0');
  ssize_t n = pread(stackFd_, text.data(), text.size(), 0);
  text.resize(n > 0 ? size_t(n) : 0);
  *status = text.empty() ? "timeout" : (monoNs() - start >= kStacksWaitNs ? "timeout" : "ok");
  return text;
}

std::string Runtime::dump(const DumpRequest& asked) {
  try {
    DumpRequest req = asked;
    takeJoin(&req);
    if (req.ask_peers && req.origin < 0) {  // started here: this rank heads the whole world
      req.origin = cfg_.rank;
      req.interval = SpreadInterval{0, cfg_.world_size};
    }
    // Hand the spread on before anything else (its heads dump in parallel with us), and
    // also when this rank dumped the incident already: a lower origin's spread must go on.
    PeerAnswers answers;
    if (req.ask_peers && claimSpread(req)) answers = askPeers(req);
    // The coordinators this rank asked to start the spread were asked first.
    answers.asked.insert(answers.asked.begin(), req.start_asks.asked.begin(), req.start_asks.asked.end());
    answers.answered.insert(answers.answered.begin(), req.start_asks.answered.begin(), req.start_asks.answered.end());
    answers.unanswered.insert(answers.unanswered.begin(), req.start_asks.unanswered.begin(),
                              req.start_asks.unanswered.end());
    bool replace = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      bool fresh = dumped_.emplace(req.incident, DumpState::kWriting).second;
      if (fresh) {
        dumpedOrder_.push_back(req.incident);
        forgetOldIncidents();
      }
      if (!fresh) {
        waitForDump(lk, req.incident, kDumpWaitNs);
        // Two survivors of one failure ask each other: whichever asks first makes the other
        // dump "peer_request"; the other's own error then replaces that dump.
        DumpState& state = dumped_[req.incident];
        if (req.reason != "error" || state != DumpState::kWrittenForPeer) return "";
        state = DumpState::kWriting;
        replace = true;
      }
    }
    struct Done {  // mark the incident written (or given up) whatever happens below
      Runtime* rt;
      const DumpRequest& req;
      ~Done() {
        std::lock_guard<std::mutex> g(rt->mu_);
        rt->dumped_[req.incident] =
            req.reason == "peer_request" ? DumpState::kWrittenForPeer : DumpState::kWritten;
        rt->dumpedCv_.notify_all();
      }
    } done{this, req};
    std::lock_guard<std::mutex> g(dumpMu_);
    int64_t nowMono = monoNs();
    int64_t nowWall = wallNs();
    JsonWriter w;
    w.beginObject();
    w.field("schema", "hetobs.dump").field("version", "2.1");
    w.field("job", cfg_.job).field("incident", req.incident).field("rank", cfg_.rank);
    w.field("world_size", cfg_.world_size).field("host", host_).field("pid", int(getpid()));
    w.field("process_start_time", stats_->header()->process_start_ticks);
    w.field("reason", req.reason).field("cause", req.cause);
    writeCauseInfo(w, "cause_info", req.cause_info);  // 2.1: the cause as data
    if (req.requested_by >= 0) w.field("requested_by", req.requested_by);
    else w.nullField("requested_by");
    w.field("time_ns", nowWall);
    if (req.hang_detected_ns > 0) w.field("hang_detected_ns", req.hang_detected_ns);
    else w.nullField("hang_detected_ns");
    if (req.suspect.on) {  // this rank's watchdog suspected the hang (docs/early-hangs.md)
      w.key("suspected").beginObject();
      w.field("quiet_s", req.suspect.quiet_s).field("threshold_s", req.suspect.threshold_s);
      w.field("longest_wait_s", req.suspect.longest_wait_s).field("learned_ops", req.suspect.learned_ops);
      w.endObject();
    } else {
      w.nullField("suspected");
    }
    w.field("heartbeat_ns", stats_->header()->heartbeat_ns.load());
    w.field("last_progress_ns", stats_->header()->last_progress_ns.load());
    w.field("hang_timeout_s", cfg_.hang_timeout_s);
    w.key("side_channel").beginObject();
    writeRanks(w, "asked", answers.asked);
    writeRanks(w, "answered", answers.answered);
    writeRanks(w, "unanswered", answers.unanswered);
    writeRanks(w, "coordinators_asked", req.start_asks.asked);
    w.endObject();
    if (req.origin >= 0) {  // the job-wide spread this dump belongs to (docs/dump-schema.md)
      w.key("spread").beginObject();
      w.field("origin", req.origin);
      if (req.requested_by >= 0) w.field("from", req.requested_by);
      else w.nullField("from");
      w.key("interval").beginArray().value(req.interval.lo).value(req.interval.hi).endArray();
      if (req.requested_by >= 0) w.field("asked_ns", req.asked_ns).field("received_ns", req.received_ns);
      else w.nullField("asked_ns").nullField("received_ns");
      w.field("requests_sent", int64_t(answers.asked.size()));
      w.endObject();
    } else {
      w.nullField("spread");
    }
    w.key("comms").beginArray();
    for (auto& c : comms()) c->writeState(w, nowMono);
    w.endArray();
    w.key("entries").beginArray();
    for (const OpRecord& r : Recorder::instance().snapshot()) writeEntry(w, r);
    w.endArray();
    // Native part done; now the stacks, bounded in time.
    std::string status;
    std::string stacks = collectStacks(&status);
    w.key("python").beginObject().field("status", status).field("stacks", stacks).endObject();
    w.endObject();
    if (!jobDir_.writeDump(req.incident, cfg_.rank, w.str(), replace)) return "";
    stats_->header()->dumps_written.fetch_add(1);
    std::string path = jobDir_.dumpFile(req.incident, cfg_.rank);
    HETOBS_INFO("dumped %s (%s)", path.c_str(), req.reason.c_str());
    return path;
  } catch (const std::exception& e) {
    HETOBS_WARN("could not write the dump for incident %s: %s", asked.incident.c_str(), e.what());
    return "";
  }
}

}  // namespace hetobs
