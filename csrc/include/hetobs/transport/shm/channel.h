#pragma once
// Shared-memory link to a peer on the same host. Data goes through two SPSC rings
// (ours in the peer's segment, the peer's in ours), framed like TCP so the op header
// is checked the same way. Received frames are reduced straight out of the ring (no
// staging copy). A TCP control socket to the same peer carries abort notices and
// tells us when the peer's process is gone (EOF), which shared memory cannot.
#include <memory>

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
  int pollFd() const override { return ctl_; }
  bool isShm() const override { return true; }
  const char* kind() const override { return "shm"; }

 private:
  void copyOut(uint64_t pos, void* dst, size_t len) const;       // from the in ring
  void copyIn(uint64_t pos, const void* src, size_t len);        // into the out ring
  [[noreturn]] void throwClosed(const char* during);

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
};

}  // namespace shm
}  // namespace hetobs
