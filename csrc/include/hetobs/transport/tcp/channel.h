#pragma once
// TCP link to one peer: non-blocking socket, 64-byte framed messages, data frames of
// at most kTcpFrameBytes, cumulative acks sent after each completed message and
// drained whenever the channel is polled. With a Reconnector a broken connection is
// re-made and the op resumes (tcp/reconnect.h, docs/reconnect.md): a collective's send
// then completes only once the peer acknowledged it, so every chunk the peer may still
// lack is in a buffer the algorithm has not released. Items marked SendItem::keep complete
// once written and stay listed here (up to kMaxKept) until acknowledged, so several chunks
// are in flight; a resume re-sends from the peer's count through the listed items.
#include <memory>
#include <string>
#include <vector>

#include "hetobs/transport/channel.h"
#include "hetobs/transport/tcp/reconnect.h"

namespace hetobs {
namespace tcp {

constexpr size_t kTcpFrameBytes = 512 * 1024;
constexpr size_t kTcpSendBuffer = 4 << 20;  // SO_SNDBUF asked for on data links (capped by wmem_max)

class TcpChannel : public Channel {
 public:
  TcpChannel(PeerInfo peer, int fd, std::unique_ptr<Reconnector> reconnect = nullptr);
  ~TcpChannel() override;

  bool progressSend(SendItem& item, const OpDesc& desc) override;
  bool progressRecv(RecvItem& item, const OpDesc& expect) override;
  bool pollControl() override;
  bool peekData(FrameHeader* out) override;
  void sendAbort(const std::string& body) override;
  void discardData() override { discarding_ = true; }
  bool holdsData() const override { return haveHdr_; }
  bool peerClosed() const override { return closed_; }
  int pollFd() const override { return fd_ >= 0 ? fd_ : pendingFd_; }  // a redial's answer wakes the op too
  bool isShm() const override { return false; }
  bool sendWaitsForAck() const override { return awaitingAck_; }
  bool sendConfirmed(const SendItem& item) const override {
    return item.done && (!resumable() || ackedAbs_ >= item.end_frame);
  }
  uint64_t sendsUnackedMax() const override { return unackedMax_.load(std::memory_order_relaxed); }
  // The connection's ends as of its last (re)connect: still known once it is gone.
  std::string localAddress() const override { return localEnd_; }
  std::string remoteAddress() const override { return remoteEnd_; }
  const char* kind() const override { return "tcp"; }
  void sampleHealth() override;
  bool reconnectHistory(ReconnectHistory* out) const override;

 private:
  // Reads header bytes; returns true once a full header is held in rhdr_. Handles ack/abort frames.
  bool readHeader();
  bool flushAck();
  bool skipPayload();  // discard mode: drop the held data frame's payload; true when dropped
  [[noreturn]] void throwClosed(const char* during);
  [[noreturn]] void throwIo(const char* what, int err);
  // The connection broke and is not re-made (reconnect off): closed if the peer said so, else broken.
  [[noreturn]] void throwBroken(const char* during);
  void markBroken(const char* how, bool reset);  // a reset or an end of stream without the close message
  // The connection broke (err 0: closed). Re-make it and set up the resume; false when
  // reconnecting is off (the caller raises as before). Throws PeerError / LinkError.
  bool recover(const char* during, int err);
  // The pieces of a re-make: note the break (abandon the socket, warn, record it), dial and send
  // our resume note (-1: that try failed, try again), and take the peer's note from the pending
  // connection (block: wait for it, at most kHandshakeAnswerNs; else only what has come). A dialling end
  // whose broken link no op of its uses re-makes it from a control poll without blocking on the
  // peer's note (remakeInBackground): the peer may be idle and take the redial much later.
  void noteBreak(const char* during, int err);
  int dialAndNote(bool background);
  bool finishPending(bool block);
  bool remakeInBackground();
  void adopt(int fd, const ResumeNote& theirs, int64_t brokeAtNs);
  // After a resume: move the send side back to the peer's count (rewindTo_). Frames of kept
  // items come again from replayKept(); the current item restarts at its frame.
  void startRewind();
  void applyRewind(SendItem& item);
  bool replayKept();  // re-send kept items' frames up to curFirst_; true when none is left
  void beginFrame(size_t len, size_t offset, const OpDesc& desc);  // the frame of bytes [offset, ...) of len
  // Write the frame in shdr_ from frameOff_; 1 written, 0 would block, -1 the link broke (re-made).
  int writeFrame(const uint8_t* payload, const char* during);
  void keepItem(const SendItem& item, const OpDesc& desc, bool copy);
  void releaseAcked();
  void noteUnacked(uint64_t n);
  bool resumable() const { return reconnect_ && reconnect_->enabled(); }
  void configureSocket();
  static void abandon(int fd);
  bool gated(const OpDesc& desc) const { return resumable() && !isP2P(desc.op); }

  int fd_;
  bool closed_ = false;
  bool eof_ = false;  // the peer sent its close message (FrameKind::kClose): closed on purpose
  std::string brokeHow_;  // how the connection broke, for the log and the reconnect record
  bool resetSeen_ = false;  // it broke by a reset or timeout (a network fault), not only an end of stream
  // The break being re-made (breakDeadline_ 0: none): when, until when, why; and a redial that
  // waits for the peer's resume note (pendingFd_ >= 0, pendingOff_ bytes of it read).
  int64_t breakNs_ = 0, breakDeadline_ = 0;
  std::string breakWhy_;
  int pendingFd_ = -1;
  ResumeNote pendingNote_{};
  size_t pendingOff_ = 0;
  // A background re-make tries once (up to kBackgroundTryNs), then again no sooner than
  // kBackgroundRetryNs later: an op polling a link whose network is down is not held long.
  int64_t nextBackgroundTry_ = 0;
  static constexpr int64_t kBackgroundTryNs = 2000000000LL;
  static constexpr int64_t kBackgroundRetryNs = 200000000LL;
  bool discarding_ = false;
  // send side: the frame being written
  FrameHeader shdr_{};
  bool inFrame_ = false;
  size_t frameOff_ = 0;  // bytes of header+payload written
  // acks owed to the peer (cumulative frames received); ackedOut_: the count the last ack carried
  bool ackOwed_ = false;
  uint64_t ackedOut_ = 0;
  static constexpr uint64_t kAckEveryFrames = 8;
  FrameHeader ahdr_{};
  size_t ackOff_ = 0;  // >0 while an ack frame is half written
  // recv side
  FrameHeader rhdr_{};
  size_t rhdrOff_ = 0;
  bool haveHdr_ = false;
  size_t rpayOff_ = 0;
  std::vector<uint8_t> staging_;
  // reconnect and resume
  std::unique_ptr<Reconnector> reconnect_;
  uint32_t generation_ = 0;
  uint64_t ackedAbs_ = 0;      // frames the peer confirmed, over the link's life
  uint64_t curFirst_ = 0;      // first frame of the unfinished (or next) send item
  uint64_t rewindTo_ = ~0ull;  // after a reconnect: resend from this frame (~0: nothing pending)
  bool itemRewound_ = false;   // the current item must restart at frame itemFrames_ (startRewind)
  size_t itemFrames_ = 0;
  // Kept items, written and not yet acknowledged, oldest first: frames [first, end), all
  // contiguous and ending at curFirst_. A ring: no allocation per chunk. A collective's kept
  // items point into the algorithm's buffers (at most kMaxKept at once); a point-to-point send
  // or relay returns once written, so its bytes are copied (`owned`) and held until the peer
  // acknowledges them: a blocking send must not wait for the matching receive, and the ring
  // grows for as many such sends as the peer leaves unreceived (bounded by the kernel's buffers
  // in between: a receiver reads only into posted receives). Released copies' memory is reused.
  struct Kept {
    const uint8_t* data = nullptr;
    size_t len = 0;
    uint64_t first = 0, end = 0;
    OpDesc desc{};
    bool owned = false;
    std::vector<uint8_t> copy;
    const uint8_t* bytes() const { return owned ? copy.data() : data; }
  };
  static constexpr size_t kMaxKept = 32;
  std::vector<Kept> kept_ = std::vector<Kept>(kMaxKept);
  size_t keptHead_ = 0, keptCount_ = 0;
  Kept& keptAt(size_t i) { return kept_[(keptHead_ + i) % kept_.size()]; }
  const Kept& keptAt(size_t i) const { return kept_[(keptHead_ + i) % kept_.size()]; }
  Kept& pushKept();  // a slot at the tail (the ring grows when full)
  void retire(Kept& k);  // a released item: its copy's memory goes to spareCopies_ (or is freed)
  void dropKept();       // forget every kept item (an op failed: nothing will confirm them)
  static constexpr size_t kSpareCopies = 4;
  std::vector<std::vector<uint8_t>> spareCopies_;  // memory of released copies, reused
  // Recover a broken link that holds data the peer may lack, even when no op uses it now.
  bool holdsUnacked() const { return framesSent_ > ackedAbs_; }
  std::atomic<uint64_t> unackedMax_{0};
  uint64_t heldFrom() const { return keptCount_ ? kept_[keptHead_].first : curFirst_; }
  bool awaitingAck_ = false;   // the current send is written and waits for its ack
  std::string localEnd_, remoteEnd_;  // "ip:port" of the connection, for naming a dead link
};

}  // namespace tcp
}  // namespace hetobs
