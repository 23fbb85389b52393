#include "hetobs/transport/tcp/channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hetobs/collectives/reduce_kernels.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"

namespace hetobs {
namespace tcp {
namespace {


bool wouldBlock(int e) { return e == EAGAIN || e == EWOULDBLOCK; }

}  // namespace

TcpChannel::TcpChannel(PeerInfo peer, int fd) : Channel(std::move(peer)), fd_(fd) {
  setNonBlocking(fd_, true);
  setNoDelay(fd_);
  staging_.resize(kTcpFrameBytes);
}

TcpChannel::~TcpChannel() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpChannel::throwClosed(const char* during) {
  throw PeerError(strFormat("%s closed its connection (%s)", peer_.describe().c_str(), during), peer_.rank, true);
}

void TcpChannel::throwIo(const char* what, int err) {
  if (err == EPIPE || err == ECONNRESET) throwClosed(what);
  throw PeerError(strFormat("%s on the link to %s failed: %s", what, peer_.describe().c_str(),
                            errnoString(err).c_str()),
                  peer_.rank, false);
}

bool TcpChannel::flushAck() {
  if (!ackOwed_ && ackOff_ == 0) return true;
  if (inFrame_) return false;  // never split a data frame
  if (ackOff_ == 0) {
    memset(&ahdr_, 0, sizeof ahdr_);
    ahdr_.magic = kFrameMagic;
    ahdr_.kind = uint8_t(FrameKind::kAck);
    ahdr_.chunk = framesRecv_;
    ackOwed_ = false;
  }
  while (ackOff_ < sizeof ahdr_) {
    ssize_t n = send(fd_, reinterpret_cast<char*>(&ahdr_) + ackOff_, sizeof ahdr_ - ackOff_,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      ackOff_ += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && wouldBlock(errno)) return false;
    // Acks are advisory: a peer that finished and left does not need them, and the
    // data they confirm has already arrived. Only a later read or send may fail.
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      closed_ = true;
      ackOff_ = 0;
      return true;
    }
    throwIo("sending an ack", errno);
  }
  ackOff_ = 0;
  return true;
}

bool TcpChannel::progressSend(SendItem& item, const OpDesc& desc) {
  if (item.done) return true;
  noteSendStart(item);
  if (closed_) throwClosed("while this rank was sending");
  for (;;) {
    if (!inFrame_) {
      if (ackOff_ != 0 || ackOwed_) {
        if (!flushAck()) return false;
      }
      if (item.offset == item.len && item.frames > 0) break;
      memset(&shdr_, 0, sizeof shdr_);
      shdr_.magic = kFrameMagic;
      shdr_.kind = uint8_t(FrameKind::kData);
      shdr_.setDesc(desc);
      shdr_.chunk = framesSent_;
      shdr_.bytes = std::min(item.len - item.offset, kTcpFrameBytes);
      inFrame_ = true;
      frameOff_ = 0;
    }
    iovec iov[2];
    int cnt = 0;
    if (frameOff_ < sizeof shdr_) {
      iov[cnt++] = {reinterpret_cast<char*>(&shdr_) + frameOff_, sizeof shdr_ - frameOff_};
    }
    size_t payDone = frameOff_ > sizeof shdr_ ? frameOff_ - sizeof shdr_ : 0;
    if (payDone < shdr_.bytes) {
      iov[cnt++] = {const_cast<uint8_t*>(item.data) + item.offset + payDone, size_t(shdr_.bytes - payDone)};
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = size_t(cnt);
    ssize_t n = sendmsg(fd_, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (wouldBlock(errno)) return false;
      throwIo("sending data", errno);
    }
    size_t before = frameOff_ > sizeof shdr_ ? frameOff_ - sizeof shdr_ : 0;
    frameOff_ += size_t(n);
    size_t after = frameOff_ > sizeof shdr_ ? frameOff_ - sizeof shdr_ : 0;
    LinkCounters::add(counters().bytes_sent, after - before);
    if (frameOff_ == sizeof shdr_ + shdr_.bytes) {
      inFrame_ = false;
      noteFrameSent(item, size_t(shdr_.bytes));
    }
  }
  return noteSendDone(item);
}

bool TcpChannel::readHeader() {
  while (!haveHdr_) {
    ssize_t n = recv(fd_, reinterpret_cast<char*>(&rhdr_) + rhdrOff_, sizeof rhdr_ - rhdrOff_, MSG_DONTWAIT);
    if (n == 0) {
      closed_ = true;
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (wouldBlock(errno)) return false;
      if (errno == ECONNRESET) {
        closed_ = true;
        return false;
      }
      throwIo("receiving", errno);
    }
    rhdrOff_ += size_t(n);
    if (rhdrOff_ < sizeof rhdr_) continue;
    rhdrOff_ = 0;
    if (rhdr_.magic != kFrameMagic)
      throw PeerError(strFormat("protocol error on the link to %s: bad frame magic 0x%08x", peer_.describe().c_str(),
                                rhdr_.magic),
                      peer_.rank, false);
    switch (FrameKind(rhdr_.kind)) {
      case FrameKind::kAck:
        noteAcked(rhdr_.chunk);
        continue;
      case FrameKind::kAbort: {
        size_t len = std::min<size_t>(rhdr_.bytes, kMaxAbortBody);
        std::string body(len, '\0');
        // An abort body is small and follows its header at once: read it with a short bound.
        try {
          setNonBlocking(fd_, false);
          readFull(fd_, body.data(), len, monoNs() + 500000000LL, "abort notice");
        } catch (const Error&) {
          body = "(abort notice truncated)";
        }
        setNonBlocking(fd_, true);
        throw RemoteAbort(peer_.rank, body);
      }
      case FrameKind::kData:
        haveHdr_ = true;
        rpayOff_ = 0;
        if (discarding_ && !skipPayload()) return false;
        if (discarding_) continue;
        return true;
      default:
        throw PeerError(strFormat("protocol error on the link to %s: unknown frame kind %d", peer_.describe().c_str(),
                                  int(rhdr_.kind)),
                        peer_.rank, false);
    }
  }
  return true;
}

bool TcpChannel::skipPayload() {
  while (rpayOff_ < rhdr_.bytes) {
    size_t n0 = std::min<size_t>(rhdr_.bytes - rpayOff_, staging_.size());
    ssize_t n = recv(fd_, staging_.data(), n0, MSG_DONTWAIT);
    if (n == 0) {
      closed_ = true;
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (wouldBlock(errno)) return false;
      closed_ = true;
      return false;
    }
    rpayOff_ += size_t(n);
  }
  haveHdr_ = false;
  return true;
}

bool TcpChannel::progressRecv(RecvItem& item, const OpDesc& expect) {
  if (item.done) return true;
  noteRecvStart(item);
  for (;;) {
    if (!haveHdr_) {
      if (!readHeader()) {
        if (closed_) throwClosed("while this rank was receiving from it");
        return false;
      }
    }
    checkFrame(peer_, rhdr_.desc(), expect);
    if (rhdr_.bytes > item.len - item.offset)
      throw FrameMismatch(peer_.rank, rhdr_.desc(), expect,
                          strFormat("%s sent %llu more bytes than this rank expects for %s", peer_.describe().c_str(),
                                    (unsigned long long)rhdr_.bytes, expect.str().c_str()));
    uint8_t* target = item.mode == RecvMode::kCopy ? item.dst + item.offset : staging_.data();
    while (rpayOff_ < rhdr_.bytes) {
      ssize_t n = recv(fd_, target + rpayOff_, rhdr_.bytes - rpayOff_, MSG_DONTWAIT);
      if (n == 0) {
        closed_ = true;
        throwClosed("in the middle of a message");
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (wouldBlock(errno)) return false;
        throwIo("receiving data", errno);
      }
      rpayOff_ += size_t(n);
      LinkCounters::add(counters().bytes_recv, size_t(n));
    }
    if (item.mode == RecvMode::kReduce) {
      size_t es = dtypeSize(item.dtype);
      reduceInto(item.dtype, item.redop, item.dst + item.offset, item.local + item.offset, staging_.data(),
                 rhdr_.bytes / es);
    }
    haveHdr_ = false;
    noteFrameReceived(item, size_t(rhdr_.bytes));
    if (item.offset == item.len) {
      noteRecvDone(item);
      ackOwed_ = true;
      flushAck();
      return true;
    }
  }
}

bool TcpChannel::pollControl() {
  bool changed = false;
  if (ackOwed_ || ackOff_) changed |= flushAck();
  if (discarding_ && haveHdr_ && !skipPayload()) return changed;
  if (!haveHdr_ && !closed_) {
    uint64_t acked = progress().send_acked.load(std::memory_order_relaxed);
    if (readHeader()) changed = true;
    changed |= acked != progress().send_acked.load(std::memory_order_relaxed);
    if (closed_) changed = true;
  }
  return changed;
}

bool TcpChannel::peekData(FrameHeader* out) {
  if (!haveHdr_) return false;
  *out = rhdr_;
  return true;
}

void TcpChannel::sendAbort(const std::string& body) {
  try {
    setNonBlocking(fd_, false);
    int64_t deadline = monoNs() + 300000000LL;  // never hold an erroring rank long
    if (inFrame_) {
      // Finish the half-written data frame with zeros so the abort starts on a frame boundary.
      size_t left = sizeof shdr_ + shdr_.bytes - frameOff_;
      if (frameOff_ < sizeof shdr_) {
        writeFull(fd_, reinterpret_cast<char*>(&shdr_) + frameOff_, sizeof shdr_ - frameOff_, deadline, "abort");
        left -= sizeof shdr_ - frameOff_;
      }
      std::vector<char> zeros(std::min<size_t>(left, 65536), 0);
      while (left) {
        size_t n = std::min(left, zeros.size());
        writeFull(fd_, zeros.data(), n, deadline, "abort");
        left -= n;
      }
      inFrame_ = false;
    }
    if (ackOff_) {
      writeFull(fd_, reinterpret_cast<char*>(&ahdr_) + ackOff_, sizeof ahdr_ - ackOff_, deadline, "abort");
      ackOff_ = 0;
    }
    std::string buf = abortFrame(body);
    writeFull(fd_, buf.data(), buf.size(), deadline, "abort");
  } catch (const Error& e) {
    HETOBS_DEBUG("could not send abort notice to %s: %s", peer_.describe().c_str(), e.what());
    shutdown(fd_, SHUT_WR);
  }
  setNonBlocking(fd_, true);
}

}  // namespace tcp
}  // namespace hetobs
