#pragma once
// The abstract link to one peer within one communicator. Algorithms never see a
// socket or a shared-memory ring: they post SendItems and RecvItems and the
// communicator's progress loop drives the channels until every item is done.
//
// Threading: a channel is used by one thread at a time (the thread running the
// communicator's current op). Counters it updates are atomics readable by anyone.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hetobs/common/error.h"
#include "hetobs/common/wire.h"
#include "hetobs/record/arrival.h"
#include "hetobs/record/progress.h"
#include "hetobs/stats/layout.h"

namespace hetobs {

// What re-making a TCP link has met (docs/reconnect.md), copied out for a dump: a link that
// could not be re-made leaves here the break, the attempts and what each one ended in.
struct ReconnectHistory {
  // The fields say what happened as data (the diagnosis reads them: transport.py); `what`
  // says it for people.
  struct Event {
    int64_t wall_ns = 0;
    const char* stage = "";  // broke | dial | probe | resume | end (a static string)
    int err = 0;             // errno the attempt's connects ended in (ECONNREFUSED: refused); 0: none
    int64_t refused_ns = 0;  // how long every connect had been refused when the attempt ended (0: the last was not)
    std::string what;        // "broke: sending data: Connection reset by peer", "dial: ...", ...
  };
  std::string state = "up";   // up | re-making | down (gave up) | closed (the peer closed it)
  uint64_t breaks = 0;        // times the connection broke
  uint64_t attempts = 0;      // dials, probes and resume exchanges made to re-make it
  std::vector<Event> events;  // the latest few breaks and failed attempts, oldest first
};

// Who is on the other end, for error messages.
struct PeerInfo {
  int rank = -1;         // rank in the communicator
  int global_rank = -1;  // rank in the world
  std::string host;
  int pid = 0;
  std::string describe() const;  // "rank 2 (host h, pid 123)"
};

struct SendItem {
  int peer = -1;
  const uint8_t* data = nullptr;
  size_t len = 0;
  // false: copy through the link even where the receiver could read our buffer itself (shm
  // single copy): a one-way transfer between two ranks is faster as two copies in parallel.
  bool peerMayRead = true;
  // Two ranks over shared memory: the sender may write part of the message into the
  // receiver's buffer itself (shm/single_copy.h, "push"): the second half, the receiver reading
  // the first, or all of it (pushAll); where that is not allowed, peerMayRead decides as before.
  bool mayPush = false;
  // With mayPush: push all of it (the receiver reads none), each piece also copied to
  // alsoCopyTo (when set) just before it is written to the peer, while it is in this core's
  // cache: all_gather's own block, read once and written twice. alsoCopied: how much was.
  bool pushAll = false;
  uint8_t* alsoCopyTo = nullptr;
  size_t alsoCopied = 0;
  // The caller leaves `data` untouched until sendConfirmed() (a pipelined ring): a TCP link
  // with reconnect then completes the item once written, not once acknowledged, and holds
  // on to the bytes for a resume. The op's last item to that peer must not be kept: it
  // completes on the peer's ack, which confirms every earlier one before the op returns.
  bool keep = false;
  // progress state (owned by the channel)
  size_t offset = 0;
  size_t frames = 0;
  uint64_t end_frame = 0;  // the link's frame count after the item's last frame
  bool started = false;
  bool done = false;
};

enum class RecvMode : uint8_t { kCopy, kReduce };

struct RecvItem {
  int peer = -1;
  uint8_t* dst = nullptr;
  size_t len = 0;
  RecvMode mode = RecvMode::kCopy;
  // kReduce: dst[i] = local[i] (op) incoming[i]; local may equal dst.
  const uint8_t* local = nullptr;
  DType dtype = DType::kUint8;
  RedOp redop = RedOp::kSum;
  // progress state (owned by the channel)
  size_t offset = 0;
  size_t frames = 0;
  bool started = false;
  bool done = false;
};

// A data frame from `peer` disagreed with the op this rank runs.
class FrameMismatch : public MismatchError {
 public:
  FrameMismatch(int peer, const OpDesc& theirs, const OpDesc& ours, const std::string& msg)
      : MismatchError(msg), peer(peer), theirs(theirs), ours(ours) {}
  int peer;
  OpDesc theirs, ours;
};

// `peer` sent an abort notice; `body` says why (see comm/abort.h for its format).
class RemoteAbort : public Error {
 public:
  RemoteAbort(int peer, std::string body) : Error("abort notice from peer"), peer(peer), body(std::move(body)) {}
  int peer;
  std::string body;
};

// Compare a received frame's op with ours; throws FrameMismatch naming both sides.
void checkFrame(const PeerInfo& peer, const OpDesc& theirs, const OpDesc& expect);

// An abort notice as it goes on the wire (header + body, the body capped at kMaxAbortBody).
constexpr size_t kMaxAbortBody = 4096;
std::string abortFrame(const std::string& body);

class Channel {
 public:
  virtual ~Channel() = default;

  // Move as much of `item` as possible without blocking; true when finished.
  // Throws PeerError (peer gone), MismatchError (frame header disagrees).
  virtual bool progressSend(SendItem& item, const OpDesc& desc) = 0;
  virtual bool progressRecv(RecvItem& item, const OpDesc& expect) = 0;
  // Handle control traffic (acks, aborts, EOF) without consuming data meant for a
  // later op. Returns true if something changed. Throws RemoteAbort / PeerError.
  virtual bool pollControl() = 0;
  // Send an abort notice carrying `body` (best effort, bounded time, never throws).
  virtual void sendAbort(const std::string& body) = 0;
  // After a failure: drop data frames so control frames behind them can be read.
  virtual void discardData() {}
  // A data frame for a later op is parked at the head of the link (do not poll it for input).
  virtual bool holdsData() const { return false; }
  // Header of the data frame waiting at the head of the link, if any (not consumed).
  virtual bool peekData(FrameHeader* out) = 0;
  // Whether the peer's end is closed (EOF seen on its connection).
  virtual bool peerClosed() const = 0;
  // Shared memory: the peer moved what a waiting op needs since this end's progress last
  // looked (data in for a receive; room freed or frames acknowledged for a send). Re-read by
  // a waiter after it announced itself on its doorbell, before it sleeps (Doorbell::waitUnless).
  virtual bool peerMovedSinceLastLook(bool sending, bool receiving) const {
    (void)sending;
    (void)receiving;
    return false;
  }
  // The unfinished send item is written and waits only for the peer's ack (poll for input, not output).
  virtual bool sendWaitsForAck() const { return false; }
  // The peer holds everything of the done `item`: its bytes may change (SendItem::keep).
  // Acks are read by progress and pollControl(); this only looks.
  virtual bool sendConfirmed(const SendItem& item) const { return item.done; }
  // Most send items written and not yet acknowledged at once, over the link's life (TCP with
  // reconnect: how many chunks a pipelined op had in flight). Any thread.
  virtual uint64_t sendsUnackedMax() const { return 0; }

  virtual int pollFd() const = 0;       // socket to poll(); control socket for shm
  virtual bool isShm() const = 0;
  virtual const char* kind() const = 0;  // "tcp" / "shm"
  // Bytes this end received in one copy straight from the peer's buffer (shm single copy).
  virtual uint64_t singleCopyBytes() const { return 0; }
  // Bytes this end wrote straight into the peer's buffer (shm push, single_copy.h). Any thread.
  virtual uint64_t pushBytes() const { return 0; }
  // The peer's memory, read and written by an algorithm itself (all_reduce's "cma"): whether this
  // end may (shared memory, the kernel allowed reading the peer at set-up; writing takes the same
  // access), and the moves, which throw PeerError naming the peer when the kernel refuses one
  // (ESRCH: the peer is gone). Counted as single-copy bytes received and bytes pushed.
  virtual bool peerMemoryAccess() const { return false; }
  virtual void readPeerMemory(uint64_t addr, void* dst, size_t len);
  virtual void writePeerMemory(uint64_t addr, const void* src, size_t len);

  const PeerInfo& peer() const { return peer_; }
  // "ip:port" of this end and the peer's end of the TCP connection (the control connection
  // for shared memory), so a person can match a link to a firewall rule or a capture.
  virtual std::string localAddress() const;
  virtual std::string remoteAddress() const;
  PeerProgress& progress() { return stats_->progress; }
  LinkCounters& counters() { return stats_->counters; }
  std::atomic<uint64_t>& reconnects() { return stats_->reconnects; }
  LinkHealth& health() { return stats_->health; }
  // Refresh health() from the kernel (TCP links; nothing for shm). Any thread, never on the hot path.
  virtual void sampleHealth() {}
  // Links that re-make their connection: what that met so far (false: this link never does). Any thread.
  virtual bool reconnectHistory(ReconnectHistory* out) const {
    (void)out;
    return false;
  }
  // Move the counters into the rank's stats segment (before the first op); nullptr keeps them private.
  void bindStats(stats::LinkStats* slot, uint64_t commId);
  // The communicator's arrival word for the running op (record/arrival.h): data frames sent
  // carry it, data frames received are folded into it. Only the op's thread touches it.
  void bindArrival(uint64_t* word) { arrival_ = word; }

 protected:
  explicit Channel(PeerInfo peer);

  // Bookkeeping every transport does the same way (progress counters, link counters,
  // activity times, frame numbering). Frames are numbered per direction over the link's
  // life; acks count frames, so the op's "acked" counts from the op's first send.
  void noteSendStart(SendItem& item);
  void noteRecvStart(RecvItem& item);
  void noteFrameSent(SendItem& item, size_t payload);
  void noteFrameReceived(RecvItem& item, size_t payload);  // payload bytes were counted as they arrived
  void noteAcked(uint64_t framesConfirmed);  // cumulative over the link's life
  bool noteSendDone(SendItem& item);         // marks the item done; returns true
  void noteRecvDone(RecvItem& item);
  void noteActivity();
  uint64_t framesSent_ = 0;  // numbering of our frames on this link
  uint64_t framesRecv_ = 0;  // frames received on this link
  uint64_t sentBase_ = 0;    // framesSent_ when the current op started sending
  uint64_t arrivalOut() const { return arrival_ ? *arrival_ : 0; }
  // Fold a received data frame's word in (after its op was checked to be ours). Idempotent.
  void arrivalIn(uint64_t w) const {
    if (arrival_) *arrival_ = arrival::combine(*arrival_, w);
  }
  uint64_t* arrival_ = nullptr;

  PeerInfo peer_;
  std::unique_ptr<stats::LinkStats> ownStats_;
  stats::LinkStats* stats_;
};

}  // namespace hetobs
