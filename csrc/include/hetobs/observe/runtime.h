#pragma once
// Everything that watches this rank, one per process: the live stats segment, the
// job directory, the watchdog thread, dump requests (from the watchdog, peers over
// the side channel, the per-rank Unix socket, a signal, an op error) and the
// registry of communicators it inspects.
//
// Threading: the watchdog thread owns the dump queue and writes dumps; the op
// thread writes error dumps itself (before the error reaches the caller). The
// registry and the set of incidents already dumped are guarded by mu_. Nothing
// here is touched on the op hot path except the stats segment's atomics.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hetobs/bootstrap/card.h"
#include "hetobs/observe/bw_log.h"
#include "hetobs/observe/cause_info.h"
#include "hetobs/observe/dump_tree.h"
#include "hetobs/observe/job_dir.h"
#include "hetobs/observe/observed.h"
#include "hetobs/record/op_record.h"
#include "hetobs/observe/stall_history.h"
#include "hetobs/stats/segment.h"

namespace hetobs {

class HandshakePool;

struct RuntimeConfig {
  std::string job;
  std::string dir;        // HETOBS_DIR
  std::string secret;     // for side-channel requests to peers
  int rank = 0;
  int world_size = 1;
  double hang_timeout_s = 300;
  bool abort_on_hang = false;
  int dump_signal = 0;    // 0: off
  uint32_t records = 2048;
  std::string bw_log = "off";   // off | verbose | agg
  double bw_log_interval_s = 15;
  std::string bw_log_file;      // empty: stderr
};

struct PeerAnswers {
  std::vector<int> asked, answered, unanswered;
};

// A suspected hang as its rank's watchdog saw it (the dump's "suspected" object).
struct SuspectInfo {
  bool on = false;
  double quiet_s = 0;         // no progress this long when suspected
  double threshold_s = 0;     // the quiet time that made it suspect
  double longest_wait_s = 0;  // the longest quiet seen in a completed op of its communicator
  uint64_t learned_ops = 0;   // completed ops that history was taken from
};

struct DumpRequest {
  std::string incident;
  std::string reason;     // watchdog | peer_request | signal | on_demand | error
  std::string cause;      // for people
  CauseInfo cause_info;   // the same as data (dump 2.1); empty for requests that report no failure
  int requested_by = -1;
  bool ask_peers = false;  // also spread the request to every other rank (dump_tree.h)
  // The spread this request belongs to: started by `origin` (-1: none), this rank asked for
  // `interval`, by requested_by at asked_ns (its wall clock), received at received_ns (ours).
  int origin = -1;
  SpreadInterval interval;
  int64_t asked_ns = 0, received_ns = 0;
  // When this rank's own watchdog saw the hang (wall clock; 0: it did not), and the
  // coordinators it asked to start the incident's one spread (spread_join.cc).
  int64_t hang_detected_ns = 0;
  SuspectInfo suspect;  // set when this rank's watchdog dumps a suspected hang (not yet confirmed)
  PeerAnswers start_asks;
  // World ranks whose process is known to be gone (a data link's redial was refused
  // throughout): not asked, so the failure is raised without a side-channel timeout on
  // them; listed unanswered, which is what they are.
  std::vector<int> known_gone;
};

// The incident id of a hang (suspected or confirmed) of this op: a collective's is the same on
// every rank, a p2p op's is this rank's own.
std::string hangIncidentId(const OpRecord& r, int rank);

class Runtime {
 public:
  // Create the process's runtime (first call) or return it.
  static Runtime& init(const RuntimeConfig& cfg);
  static Runtime* get();

  const RuntimeConfig& config() const { return cfg_; }
  stats::Segment& stats() { return *stats_; }
  const JobDir& jobDir() const { return jobDir_; }

  void setWorld(const std::vector<Card>& cards);
  void registerComm(const std::shared_ptr<Observed>& comm);
  // Python registers faulthandler on `signal`, writing into `fd`; dumps collect stacks that way.
  void setStackDumper(int signal, int fd);
  std::string controlSocketPath() const { return unixPath_; }

  // Write this rank's dump now, in the calling thread. Returns the file written, or
  // "" if this rank already dumped that incident. Never throws (logs instead).
  std::string dump(const DumpRequest& req);
  // Hand a request to the watchdog thread (any thread, including signal-free contexts).
  void enqueue(DumpRequest req);
  // Side channel: hand `req`'s spread on to the heads of its chunks (dump_tree.h), each
  // asked once with a bounded timeout; a request started here covers the whole world.
  PeerAnswers askPeers(const DumpRequest& req);
  // Answer one side-channel request line (called by the listener thread).
  std::string handleControl(const std::string& request);

  void writeMetadata();
  // A communicator's stats slot in this rank's segment; private memory (kept in `fallback`)
  // when there is no runtime or the segment is full.
  static stats::CommStats* commStats(std::unique_ptr<stats::CommStats>* fallback, uint64_t id, int size, int rank);
  // At exit: mark clean (or not), rewrite metadata, remove the stats segment. The first
  // call also arranges for the process's exit status to be recorded (noteExitStatus).
  void markExit(bool clean);
  // The status the process passed to exit(): recorded as exit_status.code; a non-zero one
  // is not a clean exit, whatever markExit was told (sys.exit(1) looks clean to atexit).
  void noteExitStatus(int code);
  void noteProgressAt(int64_t monoNs);  // last_progress_ns = that time (a clock read the caller made)

 private:
  explicit Runtime(const RuntimeConfig& cfg);
  void watchdogLoop();
  void checkHangs();
  // The early stage (stall_history.h), watchdog thread (and markExit, under suspectMu_): an op quiet past its communicator's
  // threshold is dumped as a suspected hang; when it completes the incident is marked resolved,
  // when HETOBS_HANG_TIMEOUT passes it is confirmed (the same incident, upgraded).
  struct Suspicion {
    std::string incident;
    uint64_t record_id = 0;
    int64_t suspected_wall_ns = 0;
    SuspectInfo info;
    std::string op;
    int64_t seq = -1;
    uint64_t comm_id = 0;
    int64_t stalled_ns = 0;  // the longest quiet time seen in it so far
    bool confirmed = false;
  };
  void suspectHang(Observed& comm, const Observed::InFlight& f, const OpRecord& r, int64_t quietNs,
                   int64_t thresholdNs, const StallHistory& h);
  void opLeftFlight(uint64_t commId, StallHistory& h, const StallHistory::Left& left);
  // A suspected op no longer watched (it left flight, its communicator went away, the process
  // exits): marked resolved if its record says it completed (or was overwritten: finished).
  void endSuspicion(const Suspicion& s);
  // markExit: a suspected op that completed since the last tick is resolved before the process goes.
  void endSuspicionsAtExit();
  std::mutex suspectMu_;  // the early stage's state below: the watchdog's ticks and markExit
  // When the watchdog last woke long past its tick (this process was stopped or not run): the
  // early stage measures quiet time from then, never across this process's own freeze.
  int64_t resumedAtNs_ = 0;  // watchdog thread only
  // True when the hang of this op was suspected here: upgraded to confirmed (not dumped again).
  bool confirmSuspicion(Observed& comm, uint64_t recordId, const std::string& what);
  DumpRequest hangRequest(const Observed::InFlight& f, const OpRecord& r, const std::string& what) const;
  void writeIncidentState(const std::string& incident, const char* state, const std::string& json);
  void writeConfirmed(const std::string& incident, int64_t quietNs, int64_t suspectedWallNs);
  SuspectSettings suspect_;
  std::map<uint64_t, StallHistory> stalls_;     // per communicator id
  std::map<uint64_t, Suspicion> suspicions_;    // per communicator id: its suspected op in flight
  void sampleLinkHealthWhenDue();  // watchdog thread only
  void startUnixSocket();
  void unixLoop();
  std::string newIncidentId(const char* kind) const;
  std::string collectStacks(std::string* status);
  std::vector<std::shared_ptr<Observed>> comms();

  RuntimeConfig cfg_;
  std::unique_ptr<stats::Segment> stats_;
  std::unique_ptr<BwLog> bwLog_;
  JobDir jobDir_;
  std::vector<Card> world_;
  std::string host_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DumpRequest> queue_;
  // This rank's dump of each incident. A second request for an incident being written
  // waits for it: an erroring op thread must not return (and let the process exit) while
  // the watchdog thread is still writing that incident's dump. A dump written at a peer's
  // request is replaced by this rank's own error dump of the same incident, so the file
  // says what this rank saw (its cause).
  enum class DumpState { kWriting, kWritten, kWrittenForPeer };
  std::map<std::string, DumpState> dumped_;
  std::condition_variable dumpedCv_;
  bool waitForDump(std::unique_lock<std::mutex>& lk, const std::string& incident, int64_t timeoutNs);
  std::set<std::string> hangsReported_;
  // Incident ids come from peers and from every hang: the sets above keep the newest
  // kIncidentsKept of each (a forgotten id asked again finds its dump file already there).
  static constexpr size_t kIncidentsKept = 1024;
  std::deque<std::string> dumpedOrder_, hangsOrder_;
  void forgetOldIncidents();  // with mu_ held
  // Per incident, the origin of the spread this rank handed on. One started here only if
  // none reached us yet; a received one also when its origin is lower than the one handed
  // on, so the lowest origin's spread is handed on by every rank and reaches all of them.
  std::map<std::string, int> spreadOrigin_;
  bool claimSpread(const DumpRequest& req);
  // A hang seen here joins the incident's one spread (spread_join.cc): a coordinator is
  // asked to start it, and this rank's watchdog dump waits in joins_ for the spread to
  // reach it; if none does by the deadline, this rank starts its own.
  struct PendingJoin {
    DumpRequest req;
    int64_t deadline_mono_ns = 0;
  };
  std::map<std::string, PendingJoin> joins_;
  void joinOrStartSpread(DumpRequest req);  // watchdog thread
  void startOverdueJoins();                  // watchdog thread
  bool askToStartSpread(int coordinator, const DumpRequest& req);
  void takeJoin(DumpRequest* req);  // a pending join of req's incident is folded into req
  std::vector<std::weak_ptr<Observed>> comms_;
  std::mutex dumpMu_;  // one dump at a time (stacks share one file)

  int stackSignal_ = 0;
  int stackFd_ = -1;
  int wakeFd_ = -1;      // eventfd: signal handler -> watchdog
  int unixFd_ = -1;
  std::string unixPath_;
  std::atomic<bool> exited_{false};
  std::atomic<bool> cleanExit_{false};
  std::atomic<int> exitCode_{-1};  // -1: not known (running, or killed by a signal)
  std::atomic<int64_t> exitWallNs_{0};
  std::string commsJson_;  // the comms array as last written before exit (guarded by mu_)
  std::string segmentPath_;  // where the stats segment is (or was, after exit)
  int64_t startWallNs_;
  int64_t lastHealthSampleNs_ = 0;  // watchdog thread only
  std::thread watchdog_;
  std::thread unixThread_;
  // Each control-socket client on its own thread with a read deadline: a silent one delays
  // nobody. Never destroyed, like the runtime (its threads may run until exit).
  HandshakePool* unixPool_ = nullptr;
  void serveUnixClient(int fd, const std::function<void()>& heard);
};

// Send one control request to a rank's side channel; returns its reply or throws Error.
std::string sideChannelRequest(const std::string& ip, int port, const std::string& job, const std::string& secret,
                               const std::string& request, double timeoutS);

}  // namespace hetobs
