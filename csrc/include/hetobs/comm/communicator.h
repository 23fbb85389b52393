#pragma once
// A group of ranks that run collectives together. Owns one channel per peer (TCP or
// shared memory), the sequence counters, the op records it writes, and the error
// state: after a failure it refuses further ops, because peers may still write into
// the caller's buffers.
//
// Its parts, each in its own file: the op's record and stats slot (observe/op_scope.h, shared
// with ExternalComm); how the op thread waits (comm/wait_policy.h) and its sockets' epoll set
// (comm/epoll_set.h); the failure state and the op-mismatch vote (comm/failure_state.h); the
// links (connect.cc), the progress loop and failure handling (progress.cc), dumps (state.cc).
//
// Threading: ops run one at a time, in submission order, either inline on the
// caller's thread or on the communicator's worker thread (async ops, and blocking
// ops issued while async ones are pending). links() and records may be read from
// any thread at any time.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hetobs/comm/abort.h"
#include "hetobs/comm/config.h"
#include "hetobs/comm/epoll_set.h"
#include "hetobs/comm/failure_state.h"
#include "hetobs/common/json.h"
#include "hetobs/stats/layout.h"
#include "hetobs/comm/wait_policy.h"
#include "hetobs/comm/work.h"
#include "hetobs/observe/cause_info.h"
#include "hetobs/observe/observed.h"
#include "hetobs/observe/op_scope.h"
#include "hetobs/common/wire.h"
#include "hetobs/transport/channel.h"

namespace hetobs {

class Endpoint;
class ExchangeFeed;
class RelayState;
struct RelayRequest;
namespace shm {
class Segment;
struct SegmentHeader;
}

struct OpArgs {
  OpKind op = OpKind::kAllReduce;
  DType dtype = DType::kFloat32;
  RedOp redop = RedOp::kSum;
  int root_or_peer = 0;
  const uint8_t* send = nullptr;
  size_t send_count = 0;
  uint8_t* recv = nullptr;
  size_t recv_count = 0;
  double timeout_s = -1;  // negative: the communicator's default
  std::shared_ptr<RelayRequest> relay;  // kRelay: its messages, settings and (after) phases
};

struct LinkInfo {
  int peer;
  int global_peer;
  std::string host;
  int pid;
  std::string transport;
  std::string local_address, remote_address;
  uint64_t bytes_sent, bytes_recv, frames_sent, frames_recv;
  int64_t busy_ns, last_activity_ns;
  uint64_t send_posted, send_sent, send_acked, send_done, recv_posted, recv_received, recv_done;
  int64_t progress_change_ns;
  uint64_t reconnects = 0;  // TCP connection re-made after a break
  uint64_t single_copy_bytes = 0;  // received straight from the peer's buffer (shm single copy)
  uint64_t push_bytes = 0;         // written by this end straight into the peer's buffer (shm push)
  uint64_t sends_unacked_max = 0;  // Channel::sendsUnackedMax()
  LinkHealthSnapshot health;  // samples == 0: no kernel state (shm links)
};

class Communicator : public Observed, public std::enable_shared_from_this<Communicator> {
 public:
  Communicator(std::shared_ptr<Endpoint> endpoint, uint64_t id, std::vector<int> globalRanks, int rank);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Build the channels to every member (collective over the members).
  void connect();

  int rank() const { return rank_; }
  int size() const { return int(global_.size()); }
  uint64_t id() const { return id_; }
  const std::vector<int>& globalRanks() const { return global_; }
  // Ranks in the job's world, as metadata and dumps name them (equal to globalRanks() unless
  // this communicator's endpoint serves a sub-group only, e.g. a torch.distributed group).
  const std::vector<int>& worldRanks() const { return world_.empty() ? global_ : world_; }
  void setWorldRanks(std::vector<int> ranks) { world_ = std::move(ranks); }
  const CommConfig& config() const;
  const Endpoint& endpoint() const { return *endpoint_; }

  // Blocking: runs the op and returns nullptr (throws its error). Async: returns a Work.
  std::shared_ptr<Work> submit(const OpArgs& args, bool async);
  // Collective: ranks with equal color >= 0 form a new communicator ordered by (key, rank).
  std::shared_ptr<Communicator> split(int color, int key);
  std::vector<LinkInfo> links() const;
  void close();

  // ---- Observed: for the watchdog and dumps, from any thread ----
  uint64_t observedId() const override { return id_; }
  bool inFlight(InFlight* out) const override;
  void requestAbort(const std::string& why) override;  // the running op notices within one wait
  void writeState(JsonWriter& w, int64_t nowMono) const override;
  void writeMetadata(JsonWriter& w) const override;
  void sampleLinkHealth() const override;

  // ---- for algorithms, on the thread running the op ----
  // Post the items and drive the channels until all are done. Items to the same peer
  // in the same direction complete in order.
  void exchange(SendItem* sends, size_t ns, RecvItem* recvs, size_t nr);
  // Like exchange, but items come from `feed` as they become ready (the relay pipeline).
  void exchangeFed(ExchangeFeed& feed);
  // Throw the op's timeout / watchdog abort if due (for waits outside exchange).
  void checkDeadline();
  const OpDesc& desc() const { return desc_; }
  std::string describePeer(int peer) const { return peerInfo_[size_t(peer)].describe(); }
  // The link to `peer` (connected for the running op's algorithm), for algorithms that
  // pick a path by transport or wait on acknowledgements.
  Channel* channel(int peer) const { return channels_[size_t(peer)].get(); }
  // Staging, copy lanes and per-peer stage counters of relay ops (made on first use).
  RelayState& relayState();
  uint8_t* scratch(size_t bytes);
  size_t smallBytes() const;
  // Every member on this host and shared memory allowed: the same answer on every rank
  // (worked out from the members' cards, not from which links came up), so all ranks pick
  // the same algorithm.
  bool oneHostShm() const { return oneHostShm_; }
  // An op found a rank that may not read and write every peer's memory (cma.cc):
  // every rank learnt it in that op and runs the ring from then on.
  bool peerMemoryRefused() const { return peerMemoryRefused_; }
  void notePeerMemoryRefused() { peerMemoryRefused_ = true; }
  // Wait policy (progress.cc): when this host's members outnumber the CPUs this process may
  // run on, a waiting rank yields at once instead of busy-polling (spinning would keep the
  // peer it waits for off the core).
  bool oversubscribed();

 private:
  // `start`: when it starts (a blocking op: when it was enqueued, one clock read for both).
  // `entrySysNs`: the caller's call as CLOCK_MONOTONIC itself (the who-arrives-last stamp: exact
  // between processes of a host, unlike monoNs(), whose per-process calibration errs by microseconds).
  void execute(const OpArgs& args, int64_t enqueueNs, int64_t start, int64_t entrySysNs);
  void workerLoop();
  OpDesc expectFrom(int peer) const;
  OpDesc descFor(int peer) const;  // what our frames to `peer` carry
  void waitForEvents(SendItem* sends, size_t ns, RecvItem* recvs, size_t nr, uint32_t bellSeen, int64_t idleNs);
  void pollAllControl();
  void pollControlWhenDue(int64_t now, int64_t* nextControl, shm::SegmentHeader* seg);
  void throwIfAbortRequested() const;
  [[noreturn]] void timeoutError(SendItem* sends, size_t ns, RecvItem* recvs, size_t nr);
  [[noreturn]] void handleFailure(std::exception_ptr e);
  [[noreturn]] void resolveMismatch(int directPeer, const OpDesc* directTheirs, const struct AbortNotice* notice);
  void abortPeers(const struct AbortNotice& n);
  // A mismatch notice about a later collective than the one running here: the reporter
  // finished ours, so ours may still finish. Keep it (true) for the next op to raise,
  // which is where the user's code deviated or not.
  bool deferLaterMismatch(const RemoteAbort& a);
  // Mark failed with `msg`, tell every peer (notice `n`), log, dump: before the throw.
  // `from`: the comm rank whose notice brought the news (-1: seen first-hand).
  void failWith(const struct AbortNotice& n, const std::string& msg, int from = -1);
  std::string opContext() const;
  void buildChannels();
  // inOp: for the running op (a peer that never comes is the op's timeout, naming it).
  void connectPeers(const std::vector<int>& want, std::vector<int>& fds, int64_t deadline, bool inOp);
  // Connect the peers in `want` not connected yet (on the op thread, before the op runs).
  void ensureChannels(const std::vector<int>& want);
  std::unique_ptr<Channel> makeTcpChannel(int p, int fd);

  std::shared_ptr<Endpoint> endpoint_;
  uint64_t id_;
  std::vector<int> global_;
  std::vector<int> world_;
  int rank_;
  std::vector<std::unique_ptr<Channel>> channels_;  // by comm rank; null for self and peers not connected yet
  // Observers (dumps, the watchdog, links()) walk channels_ and the relay state under this
  // lock, and close() takes them away under it. The op thread takes it only to fill a slot
  // connected on demand (once per peer); otherwise only close(), which first waits out the
  // running op (execMu_), changes them while ops run.
  mutable std::mutex observeMu_;
  bool inFlightLocked(InFlight* out) const;  // inFlight() with observeMu_ held
  std::vector<PeerInfo> peerInfo_;                  // by comm rank
  std::vector<int> neededScratch_, missingScratch_;
  bool allConnected_ = false;  // peers an op needs (kept: no allocation per op)
  std::unique_ptr<shm::Segment> segment_;           // ours (incoming rings, doorbell)
  bool anyShm_ = false, anyTcp_ = false;
  bool oneHostShm_ = false;
  bool peerMemoryRefused_ = false;
  WaitPolicy wait_;  // spin, yield, sleep: adapts to how this communicator's waits end
  EpollSet epoll_;   // the op thread's wait on its sockets

  // Sequence ids: collectives share one counter; p2p counts per peer and direction.
  uint64_t collSeq_ = 0;
  uint64_t p2pSeq_ = 0;
  std::vector<uint64_t> sendSeq_, recvSeq_;
  uint64_t splitCount_ = 0;
  // Relays: each end of a link counts the relays it shares with the other (only the ranks
  // that call a relay take part, so a communicator-wide counter would drift).
  std::vector<uint64_t> relaySeq_, relayPeerSeq_;  // by peer; relayPeerSeq_: the running relay's
  std::unique_ptr<RelayState> relay_;
  std::atomic<RelayState*> relayLive_{nullptr};  // relay_, for dumps on other threads
  void writeRelayState(JsonWriter& w) const;

  OpDesc desc_{};          // the op running now
  // Recent collectives by seq, so a rank that finished an op can still say what it
  // ran when a peer later reports a mismatch at that seq.
  static constexpr size_t kHistory = 64;
  OpDesc history_[kHistory]{};
  int64_t opStartNs_ = 0;   // when it started
  int64_t deadlineNs_ = 0;  // its deadline
  std::vector<uint8_t> scratch_;

  // Live stats in the rank's segment (private memory when the segment is full).
  stats::CommStats* cstats_ = nullptr;
  std::unique_ptr<stats::CommStats> ownStats_;
  OpScope scope_;  // the op's record and stats slot (observe/op_scope.h), one writer: this op thread
  void statsEnd(const OpDesc& d, uint64_t bytes, int64_t startMono, int64_t endMono, bool ok,
                const ArrivalInfo* arrival = nullptr);
  // Who arrived last (record/arrival.h): the running collective's arrival word, which the
  // channels' data frames carry and fold (Channel::bindArrival), and what it says at the end.
  uint64_t arrival_ = 0;
  uint64_t entryUs_ = 0;  // this rank's entry into the running op, wall-clock microseconds
  int64_t wallMinusSysMonoNs_ = 0;  // CLOCK_REALTIME - CLOCK_MONOTONIC, read at construction
  // HETOBS_DIGEST / HETOBS_TEST_FLIP_BIT as read once per process, copied here so an op with digests
  // off pays one predictable branch (docs/digests.md: "off costs nothing measurable").
  bool digestOn_ = false;
  bool flipArmed_ = false;
  void judgeArrival(const OpArgs& a, ArrivalInfo* out) const;
  // Result digests (collectives/digest.h): the test hook's bit flip, then, on sampled ops, the
  // comparison. True when ranks' results differ (*out says who and where).
  bool checkResult(const OpArgs& a, struct DigestVerdict* out);
  // Count, log and dump a difference; returns the message the op raises with.
  std::string reportDataMismatch(const struct DigestVerdict& v, std::vector<int>* worldRanksOut);
  void noteDigest(bool mismatch);
  void reportFailure(const std::string& msg, uint64_t seq);  // error dump + ask peers, before the throw
  // The failure as data (dump 2.1 cause_info, global ranks): what comms[].abort says, with the
  // culprits resolved (the vote's deviants, every peer a timeout waited on, the other end).
  CauseInfo causeInfo(uint64_t seq) const;

  std::atomic<bool> abortRequested_{false};
  std::string abortWhy_;
  std::atomic<uint64_t> inflightRecord_{0};  // record id + 1 while an op runs
  std::atomic<int64_t> inflightStart_{0};

  // The failure state and the mismatch vote's outcome (failure_state.h).
  FailureState failure_;
  std::atomic<bool> closed_{false};

  std::mutex execMu_;
  std::mutex qmu_;
  std::condition_variable qcv_;
  struct Task {
    OpArgs args;
    int64_t enqueue_ns;
    std::shared_ptr<Work> work;
    int64_t entry_sys_ns;
  };
  std::deque<Task> queue_;
  std::atomic<int> pending_{0};
  bool stopWorker_ = false;
  std::thread worker_;
};

}  // namespace hetobs
