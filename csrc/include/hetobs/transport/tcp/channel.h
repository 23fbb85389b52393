#pragma once
// TCP link to one peer: non-blocking socket, 64-byte framed messages, data frames of
// at most kTcpFrameBytes, cumulative acks sent after each completed message and
// drained whenever the channel is polled.
#include <string>
#include <vector>

#include "hetobs/transport/channel.h"

namespace hetobs {
namespace tcp {

constexpr size_t kTcpFrameBytes = 512 * 1024;

class TcpChannel : public Channel {
 public:
  TcpChannel(PeerInfo peer, int fd);
  ~TcpChannel() override;

  bool progressSend(SendItem& item, const OpDesc& desc) override;
  bool progressRecv(RecvItem& item, const OpDesc& expect) override;
  bool pollControl() override;
  bool peekData(FrameHeader* out) override;
  void sendAbort(const std::string& body) override;
  void discardData() override { discarding_ = true; }
  bool holdsData() const override { return haveHdr_; }
  bool peerClosed() const override { return closed_; }
  int pollFd() const override { return fd_; }
  bool isShm() const override { return false; }
  const char* kind() const override { return "tcp"; }

 private:
  // Reads header bytes; returns true once a full header is held in rhdr_. Handles ack/abort frames.
  bool readHeader();
  bool flushAck();
  bool skipPayload();  // discard mode: drop the held data frame's payload; true when dropped
  [[noreturn]] void throwClosed(const char* during);
  [[noreturn]] void throwIo(const char* what, int err);

  int fd_;
  bool closed_ = false;
  bool discarding_ = false;
  // send side: the frame being written
  FrameHeader shdr_{};
  bool inFrame_ = false;
  size_t frameOff_ = 0;  // bytes of header+payload written
  // acks owed to the peer (cumulative frames received)
  bool ackOwed_ = false;
  FrameHeader ahdr_{};
  size_t ackOff_ = 0;  // >0 while an ack frame is half written
  // recv side
  FrameHeader rhdr_{};
  size_t rhdrOff_ = 0;
  bool haveHdr_ = false;
  size_t rpayOff_ = 0;
  std::vector<uint8_t> staging_;
};

}  // namespace tcp
}  // namespace hetobs
