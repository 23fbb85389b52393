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
#include <memory>
#include <mutex>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hetobs/bootstrap/card.h"
#include "hetobs/observe/bw_log.h"
#include "hetobs/observe/job_dir.h"
#include "hetobs/stats/segment.h"

namespace hetobs {

class Observed;

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

struct DumpRequest {
  std::string incident;
  std::string reason;     // watchdog | peer_request | signal | on_demand | error
  std::string cause;
  int requested_by = -1;
  bool ask_peers = false;  // also ask every other rank over the side channel
};

struct PeerAnswers {
  std::vector<int> asked, answered, unanswered;
};

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
  // Side channel: ask every other world rank to dump into `incident` (bounded time).
  PeerAnswers askPeers(const std::string& incident, const std::string& reason, const std::string& cause);
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
  std::thread watchdog_;
  std::thread unixThread_;
};

// Send one control request to a rank's side channel; returns its reply or throws Error.
std::string sideChannelRequest(const std::string& ip, int port, const std::string& job, const std::string& secret,
                               const std::string& request, double timeoutS);

}  // namespace hetobs
