#pragma once
// Shared-memory link to a peer on the same host. Data goes through two SPSC rings
// (ours in the peer's segment, the peer's in ours), framed like TCP so the op header
// is checked the same way. Received frames are reduced straight out of the ring (no
// staging copy). Large collective messages go in one copy where the kernel allows it: the
// frame names the sender's buffer and the receiver reads it with process_vm_readv
// (single_copy.h). A TCP control socket to the same peer carries abort notices and
// tells us when the peer's process is gone (EOF), which shared memory cannot.
#include <atomic>
#include <memory>
#include <vector>

#include "hetobs/transport/channel.h"
#include "hetobs/transport/shm/segment.h"

namespace hetobs {
namespace shm {

class ShmChannel : public Channel {
 public:
  // `out` ring lives in `theirs` at slot `outSlot`; `in` ring in `mine` at `inSlot`.
  ShmChannel(PeerInfo peer, int controlFd, Segment* mine, std::shared_ptr<Segment> theirs, uint32_t outSlot,
             uint32_t inSlot);
  ~ShmChannel() override;

  bool progressSend(SendItem& item, const OpDesc& desc) override;
  bool progressRecv(RecvItem& item, const OpDesc& expect) override;
  bool pollControl() override;
  bool peekData(FrameHeader* out) override;
  void sendAbort(const std::string& body) override;
  bool peerClosed() const override { return closed_; }
  bool peerMovedSinceLastLook(bool sending, bool receiving) const override;
  int pollFd() const override { return ctl_; }
  bool isShm() const override { return true; }
  const char* kind() const override { return "shm"; }
  uint64_t singleCopyBytes() const override { return singleCopyBytes_.load(std::memory_order_relaxed); }
  uint64_t pushBytes() const override { return pushBytes_.load(std::memory_order_relaxed); }
  bool peerMemoryAccess() const override { return readsPeer_; }
  void readPeerMemory(uint64_t addr, void* dst, size_t len) override;
  void writePeerMemory(uint64_t addr, const void* src, size_t len) override;

 private:
  void copyOut(uint64_t pos, void* dst, size_t len) const;       // from the in ring
  void copyIn(uint64_t pos, const void* src, size_t len);        // into the out ring
  // Put a frame into the out ring (its payload after it, or none: named or pushed bytes),
  // publish it and wake the peer if it sleeps. The caller made room.
  void publishFrame(const FrameHeader& h, const uint8_t* payload);
  // Free bytes in the out ring, at least `wanted` if the peer has made that much room.
  uint64_t outRoom(uint64_t wanted);
  [[noreturn]] void throwClosed(const char* during);
  // Frame size for a message of `len` bytes through the ring (see kPiecesPerMessage).
  uint64_t pieceBytes(size_t len) const;
  bool sendsSingleCopy(const SendItem& item, const OpDesc& desc) const;
  void receiveSingleCopy(RecvItem& item, const FrameHeader& h);  // read the named bytes from the sender
  // Move bytes from or into the peer's memory; PeerError naming the peer if the kernel refuses.
  void mustRead(uint64_t addr, void* dst, size_t len) const;
  void mustWrite(uint64_t addr, const void* src, size_t len) const;
  // Mail slots (segment.h): send a frame of at most kMailPayload bytes through one (false:
  // every slot is still held, use the ring); whether the frame due next waits in its slot;
  // take it.
  bool postMail(SendItem& item, const OpDesc& desc, uint64_t piece);
  bool mailWaiting() const;
  bool takeMail(RecvItem& item, const OpDesc& expect);
  // Push (single_copy.h). Sending: whether this item offers it; once the peer answered, write
  // the rest into its buffer and say so (false: no answer yet, or no room for the frame).
  // Receiving: answer an offer in the push slot; check a frame saying the rest is in place.
  bool pushes(const SendItem& item) const;
  bool pushRest(SendItem& item, const OpDesc& desc);
  void answerPushOffer(const RecvItem& item, const OpDesc& expect);
  void checkPushed(const RecvItem& item, const FrameHeader& h);
  // A received frame's header against the op and the item (magic, op, bytes still due).
  void checkIncoming(const FrameHeader& h, const RecvItem& item, const OpDesc& expect) const;
  // After a frame's payload is in place: counters, the acknowledgement, the item's end.
  void finishFrame(RecvItem& item, size_t len);

  int ctl_;
  bool closed_ = false;
  Segment* mine_;
  std::shared_ptr<Segment> theirs_;
  RingCtl* out_;
  uint8_t* outData_;
  RingCtl* in_;
  uint8_t* inData_;
  uint64_t cap_;
  uint64_t maxPiece_;
  uint64_t head_ = 0;  // our producer position in out_
  uint64_t tail_ = 0;  // our consumer position in in_
  // What progressSend last saw of the peer's side of out_: news to a waiter when they move
  // (peerMovedSinceLastLook); never ahead of the real values, so the send path judges room in
  // the ring and free mail slots by them and reads the peer's lines again only when they say
  // too little (each read is a cache miss on a line the peer writes per frame).
  uint64_t seenOutTail_ = 0;
  uint64_t seenAcked_ = 0;
  // Single copy. Receiving: whether we can read the peer's memory (and told it so), its pid,
  // and a cache-sized buffer a reduction reads the peer's bytes into. Sending: the frame
  // count (framesSent_) the peer must acknowledge before the buffer may be let go.
  bool readsPeer_ = false;
  bool lightFence_ = false;  // the peer's waits take a heavy fence: ours after a publication need not
  int peerPid_ = 0;
  std::vector<uint8_t> reduceBuf_;
  uint64_t namedUntil_ = 0;
  // Push. Sending: whether the item pushes and the peer's answer is still due, where its
  // pushed part starts, and the offers answered so far on this link. Receiving: the
  // offers this end answered, and whether the frame saying the pushed part is in place is due.
  uint64_t pushAt_ = 0;
  bool awaitingPushTo_ = false;
  uint64_t pushOffers_ = 0;
  uint64_t pushAnswers_ = 0;
  bool expectPushed_ = false;
  std::atomic<uint64_t> singleCopyBytes_{0};
  std::atomic<uint64_t> pushBytes_{0};
};

}  // namespace shm
}  // namespace hetobs
