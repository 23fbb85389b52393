#pragma once
// Re-making a broken TCP data link (docs/reconnect.md).
//
// Roles stay as at start-up: the higher rank of the pair dials the lower rank's
// listener again (fresh authenticated handshake, Hello.generation > 0), the lower rank
// takes the parked connection. Refusal tells a death from a reset: a peer whose process
// is gone refuses at once (its port has no listener), a live peer behind a flaky network
// accepts once the network is back. Both ends then swap how many chunks they received
// from the other, and each sender resumes from there.
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "hetobs/bootstrap/handshake.h"
#include "hetobs/common/connect_retry.h"
#include "hetobs/common/error.h"
#include "hetobs/common/net.h"
#include "hetobs/transport/channel.h"

namespace hetobs {

class Listener;

namespace tcp {

// The link could not be re-made within HETOBS_RECONNECT_TIMEOUT: names both ends.
class LinkError : public PeerError {
 public:
  LinkError(const std::string& msg, int peer, std::string localEnd, std::string remoteEnd)
      : PeerError(msg, peer, false), local_end(std::move(localEnd)), remote_end(std::move(remoteEnd)) {}
  std::string local_end, remote_end;  // "rank 0 (host a, 198.18.0.1:41000)"
};

struct ReconnectPlan {
  uint64_t comm_id = 0;
  int my_rank = -1;           // comm ranks
  int peer_rank = -1;
  std::string my_host;
  SockAddr peer_listener;     // where the peer accepts (its card)
  Credentials cred;
  Listener* listener = nullptr;  // ours: where the peer's redial is parked
  double timeout_s = 30;         // HETOBS_RECONNECT_TIMEOUT (0: never try)
  bool same_host = false;        // same kernel and network namespace (card host_key): a refusal is final
};

// What both ends tell each other on the new connection before data flows again.
struct ResumeNote {
  uint32_t magic;       // kResumeMagic
  uint32_t generation;  // the dialer's count of connections on this link (1 = first reconnect)
  uint64_t frames_recv; // data chunks this end has received from the other over the link's life
};
constexpr uint32_t kResumeMagic = 0x52425448;  // "HTBR"

// The link's reconnect record (ReconnectHistory): written by the thread that re-makes the
// link, read by a dump's. A lock, taken only when the link breaks or an attempt fails.
// Each event carries its stage and errno as fields beside the sentence: the diagnosis tells a
// refused attempt by ECONNREFUSED, not by the word "refused" (issue 30).
class ReconnectLog {
 public:
  void broke(const std::string& why);  // the connection broke: re-making starts
  // One attempt failed; `stage` "dial", "probe" or "resume" (static), `detail` its error;
  // `err`/`refusedNs` from a ConnectError (failedConnect), else 0.
  void failed(const char* stage, const std::string& detail, int err = 0, int64_t refusedNs = 0);
  void failedConnect(const char* stage, const ConnectError& e) { failed(stage, e.what(), e.err, e.refused_ns); }
  void attempted(uint64_t n = 1);  // attempts made (a connect, a dial, a probe)
  void remade();                   // back up
  // "down" (gave up) or "closed"; `err` ECONNREFUSED when it ended because the peer is gone.
  void ended(const char* state, const std::string& what, int err = 0);
  ReconnectHistory snapshot() const;

 private:
  void addLocked(const char* stage, std::string what, int err = 0, int64_t refusedNs = 0);
  static constexpr size_t kEvents = 8;
  mutable std::mutex mu_;
  ReconnectHistory h_;
};

class Reconnector {
 public:
  explicit Reconnector(ReconnectPlan plan) : plan_(std::move(plan)) {}
  bool enabled() const { return plan_.timeout_s > 0; }
  bool dialer() const { return plan_.my_rank > plan_.peer_rank; }
  const ReconnectPlan& plan() const { return plan_; }

  // A fresh connection to the peer, handshake done (blocking fd), or an exception:
  // PeerError (closed=true) when the peer is gone, LinkError past the deadline.
  int remake(uint32_t generation, int64_t deadlineNs, const PeerInfo& peer, const std::string& why,
             const std::string& oldLocal, const std::string& oldRemote);
  // One try, bounded by `deadlineNs`: the fd, or -1 when it did not work out this time (the
  // attempts' errors are in the log); throws only what is final (the peer gone or closed, a
  // refusal of our key). A re-make no op waits for uses it with a short deadline, again and again.
  int tryRemake(uint32_t generation, int64_t deadlineNs, const PeerInfo& peer, const std::string& why);
  // Acceptor side: the peer's redial, if the listener holds one now (never blocks).
  int takeParked();
  ReconnectLog& log() { return log_; }
  const ReconnectLog& log() const { return log_; }

 private:
  int dial(uint32_t generation, int64_t deadlineNs, const PeerInfo& peer);
  int await(int64_t deadlineNs, const PeerInfo& peer);
  int64_t refusedForNs() const;
  // Whether the peer's listener has now refused for the whole window (refusedForNs), counted
  // across tries: a short try ends before the window can (tryRemake), and its refusal then
  // starts or extends the run that the next try continues; anything else ends the run.
  bool refusedThroughout(const ConnectError& e);

  ReconnectPlan plan_;
  ReconnectLog log_;
  int64_t refusedSinceNs_ = -1;  // when the current run of refused tries began (-1: none)
};

}  // namespace tcp
}  // namespace hetobs
