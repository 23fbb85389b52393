#include "hetobs/transport/tcp/channel.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "hetobs/collectives/reduce_kernels.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"
#include "hetobs/common/wire.h"
#include "hetobs/transport/tcp/tcp_info.h"
#include "hetobs/transport/frame_check.h"

namespace hetobs {
namespace tcp {
namespace {


bool wouldBlock(int e) { return e == EAGAIN || e == EWOULDBLOCK; }

}  // namespace

TcpChannel::TcpChannel(PeerInfo peer, int fd, std::unique_ptr<Reconnector> reconnect)
    : Channel(std::move(peer)), fd_(fd), reconnect_(std::move(reconnect)) {
  configureSocket();
  staging_.resize(kTcpFrameBytes);
}

void TcpChannel::configureSocket() {
  setNonBlocking(fd_, true);
  setNoDelay(fd_);
  // Autotuning stops the send buffer at tcp_wmem's maximum (4 MiB on this kernel's
  // defaults); an explicit request may reach twice net.core.wmem_max, so a ring step's frames
  // wait in fewer, larger writes. The kernel caps the request (never an error). The receive
  // side is left to autotuning: an explicit SO_RCVBUF caps it at rmem_max and turns
  // autotuning (up to tcp_rmem's maximum) off, and measured no better (docs/PERF.md, "Issue 15").
  int sndbuf = int(kTcpSendBuffer);
  setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  localEnd_ = Channel::localAddress();
  remoteEnd_ = Channel::remoteAddress();
  if (!reconnect_ || !reconnect_->enabled()) return;
  // A blackholed peer never resets the connection: data just stays unacknowledged and TCP
  // retransmits for ~15 minutes. TCP_USER_TIMEOUT turns that into an error after the
  // reconnect timeout, so the link counts as broken, is redialled and, still dead when the
  // reconnect timeout passes again, fails the op naming it. Short stalls (a 2 s link-down)
  // stay below it and are survived by plain retransmission. inf: the kernel's default.
  // The end that meets a reset waits for the higher rank to redial. A higher rank with
  // nothing left to send (it waits for the peer's ack, which the fault swallowed) sends no
  // packet that could meet the reset in turn, and would wait out the op's timeout.
  // Keepalive probes on a link idle for 1 s draw the peer host's reset once the fault is
  // over; on a busy link none are sent.
  int on = 1, idle = 1, interval = 1;
  setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  double s = reconnect_->plan().timeout_s;
  if (s < 1e6) {
    unsigned ms = unsigned(std::max(1000.0, s * 1000));
    setsockopt(fd_, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
  }
}

TcpChannel::~TcpChannel() {
  if (pendingFd_ >= 0) ::close(pendingFd_);
  if (fd_ < 0) return;
  // The deliberate close, said explicitly: a peer still in an op fails at once naming us, where a
  // bare end of stream or reset would send it re-making the link. Only on a frame boundary (an
  // op that failed mid-frame sent its abort notice already); never blocking: a peer that reads
  // nothing more does not need it, and a redial still hears "closed" from our listener.
  if (!inFrame_ && ackOff_ == 0) {
    FrameHeader bye{};
    bye.magic = kFrameMagic;
    bye.kind = uint8_t(FrameKind::kClose);
    ssize_t n = send(fd_, &bye, sizeof bye, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
  }
  // Unread input would make close() send a reset, which a peer still in an op takes for a
  // network fault and tries to reconnect; drained, the peer sees a plain end of stream.
  for (int i = 0; i < 256; ++i) {
    ssize_t n = recv(fd_, staging_.data(), staging_.size(), MSG_DONTWAIT);
    if (n <= 0) break;
  }
  ::close(fd_);
}

void TcpChannel::abandon(int fd) {
  // A reset, not a FIN: the peer, if it still reads this connection, must see a break to
  // re-make, not a deliberate close.
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

void TcpChannel::throwClosed(const char* during) {
  throw PeerError(strFormat("%s closed its connection (%s)", peer_.describe().c_str(), during), peer_.rank, true);
}

void TcpChannel::throwIo(const char* what, int err) {
  if (eof_) throwClosed(what);  // it said it closes: writing after that fails, nothing broke
  throw PeerError(strFormat("%s on the link to %s failed: %s", what, peer_.describe().c_str(),
                            errnoString(err).c_str()),
                  peer_.rank, false);
}

void TcpChannel::throwBroken(const char* during) {
  if (eof_) throwClosed(during);
  // Reconnect is off (HETOBS_RECONNECT_TIMEOUT=0): a reset or an end of stream without the
  // peer's close message fails the op, as a broken link, not as a peer that closed.
  throw PeerError(strFormat("the connection to %s broke (%s): reset or ended without a close message, and "
                            "HETOBS_RECONNECT_TIMEOUT=0 does not re-make it",
                            peer_.describe().c_str(), during),
                  peer_.rank, false);
}

void TcpChannel::markBroken(const char* how, bool reset) {
  closed_ = true;
  resetSeen_ |= reset;
  // The first sign tells how it broke: a reset read by a send leaves later reads an end of stream.
  if (brokeHow_.empty()) brokeHow_ = how;
}

void TcpChannel::sampleHealth() { sampleTcpInfo(fd_, health()); }

bool TcpChannel::reconnectHistory(ReconnectHistory* out) const {
  if (!resumable()) return false;
  *out = reconnect_->log().snapshot();
  return true;
}

bool TcpChannel::flushAck() {
  if (!ackOwed_ && ackOff_ == 0) return true;
  if (inFrame_) return false;  // never split a data frame
  if (fd_ < 0) return false;   // a re-make is pending: owed still, sent on the new connection
  if (ackOff_ == 0) {
    memset(&ahdr_, 0, sizeof ahdr_);
    ahdr_.magic = kFrameMagic;
    ahdr_.kind = uint8_t(FrameKind::kAck);
    ahdr_.chunk = framesRecv_;
    ackedOut_ = framesRecv_;
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
      markBroken(errnoString(errno).c_str(), true);
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
  if (!item.started) {
    // Kept items of another op were left by a failure: nothing will confirm or resend them.
    // (Copies of point-to-point sends stay: those ops completed; the peer still needs them.)
    if (keptCount_ && !keptAt(0).owned && !(keptAt(0).desc == desc)) dropKept();
    if (rewindTo_ == ~0ull && framesSent_ > curFirst_) {  // an earlier item ended in an error
      curFirst_ = framesSent_;
      dropKept();
    }
  }
  noteSendStart(item);
  // A re-make begun from a control poll is pending and this op needs the link: finish it now.
  if (fd_ < 0 && !recover("while this rank was sending", 0)) throwBroken("while this rank was sending");
  // A written item may be confirmed even so: the peer acked it and finished (its ack and end of
  // stream read by a control poll since); the loop below looks at the ack first.
  bool written = item.frames > 0 && item.offset == item.len;
  if (closed_ && !written && !recover("while this rank was sending", 0)) throwBroken("while this rank was sending");
  // Written, not yet confirmed: a kept item needs a free slot in kept_, any other item the
  // peer's ack of all of it (the buffer stays the algorithm's until then, so a reconnect can
  // resend whatever the peer lacks).
  auto confirmed = [&] {
    releaseAcked();
    return item.keep ? keptCount_ < kMaxKept : ackedAbs_ >= framesSent_;
  };
  for (;;) {
    applyRewind(item);
    if (framesSent_ < curFirst_) {
      if (!replayKept()) return false;
      continue;
    }
    if (!inFrame_) {
      if (ackOff_ != 0 || ackOwed_) {
        if (!flushAck()) return false;
      }
      if (item.offset == item.len && item.frames > 0) {
        if (!gated(desc)) break;
        if (confirmed()) break;
        if (!awaitingAck_) noteUnacked(keptCount_ + 1);
        awaitingAck_ = true;
        if (!haveHdr_) readHeader();
        if (confirmed()) break;  // confirmed, even if the peer closed right after (it finished)
        if (closed_) {
          if (!recover("while this rank waited for an ack", 0)) throwBroken("while this rank was sending");
          continue;
        }
        return false;
      }
      beginFrame(item.len, item.offset, desc);
    }
    int w = writeFrame(item.data + item.offset, "sending data");
    if (w == 0) return false;
    if (w > 0) noteFrameSent(item, size_t(shdr_.bytes));
  }
  awaitingAck_ = false;
  if (item.keep && gated(desc)) keepItem(item, desc, false);
  else if (resumable() && !gated(desc)) keepItem(item, desc, true);  // p2p or relay: done once written
  curFirst_ = framesSent_;
  item.end_frame = framesSent_;
  return noteSendDone(item);
}

void TcpChannel::beginFrame(size_t len, size_t offset, const OpDesc& desc) {
  memset(&shdr_, 0, sizeof shdr_);
  shdr_.magic = kFrameMagic;
  shdr_.kind = uint8_t(FrameKind::kData);
  shdr_.setDesc(desc);
  shdr_.chunk = framesSent_;
  shdr_.bytes = std::min(len - offset, kTcpFrameBytes);
  shdr_.arrival = arrivalOut();
  inFrame_ = true;
  frameOff_ = 0;
}

int TcpChannel::writeFrame(const uint8_t* payload, const char* during) {
  for (;;) {
    iovec iov[2];
    int cnt = 0;
    if (frameOff_ < sizeof shdr_) {
      iov[cnt++] = {reinterpret_cast<char*>(&shdr_) + frameOff_, sizeof shdr_ - frameOff_};
    }
    size_t payDone = frameOff_ > sizeof shdr_ ? frameOff_ - sizeof shdr_ : 0;
    if (payDone < shdr_.bytes) {
      iov[cnt++] = {const_cast<uint8_t*>(payload) + payDone, size_t(shdr_.bytes - payDone)};
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = size_t(cnt);
    ssize_t n = sendmsg(fd_, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (wouldBlock(errno)) return 0;
      int err = errno;
      if (!recover(during, err)) throwIo(during, err);
      return -1;
    }
    frameOff_ += size_t(n);
    size_t after = frameOff_ > sizeof shdr_ ? frameOff_ - sizeof shdr_ : 0;
    LinkCounters::add(counters().bytes_sent, after - payDone);
    if (frameOff_ == sizeof shdr_ + shdr_.bytes) {
      inFrame_ = false;
      return 1;
    }
  }
}

TcpChannel::Kept& TcpChannel::pushKept() {
  if (keptCount_ == kept_.size()) {
    std::vector<Kept> bigger(kept_.size() * 2);
    for (size_t i = 0; i < keptCount_; ++i) bigger[i] = std::move(keptAt(i));
    kept_.swap(bigger);
    keptHead_ = 0;
  }
  Kept& k = keptAt(keptCount_++);
  return k;
}

void TcpChannel::keepItem(const SendItem& item, const OpDesc& desc, bool copy) {
  // A copy holds only what the peer has not confirmed: it acks long messages as they arrive, and
  // those acks wait unread on the link (nothing reads while a send writes).
  if (copy && !haveHdr_ && !closed_ && fd_ >= 0) readHeader();
  releaseAcked();
  if (ackedAbs_ >= framesSent_) return;  // confirmed already: nothing to hold
  Kept& k = pushKept();
  k.data = item.data;
  k.len = item.len;
  k.first = framesSent_ - item.frames;
  k.end = framesSent_;
  k.desc = desc;
  k.owned = copy;
  if (!copy) {
    noteUnacked(keptCount_);
    return;
  }
  if (ackedAbs_ > k.first) {  // whole frames: a resume re-sends the copy frame by frame
    size_t skip = size_t(ackedAbs_ - k.first) * kTcpFrameBytes;
    k.first = ackedAbs_;
    k.data += skip;
    k.len -= skip;
  }
  // Into a spare buffer's memory when one is big enough: a fresh allocation per message costs
  // page faults that made 64 MiB sends several times slower than the copy itself.
  size_t best = spareCopies_.size();
  for (size_t i = 0; i < spareCopies_.size(); ++i)
    if (spareCopies_[i].capacity() >= k.len &&
        (best == spareCopies_.size() || spareCopies_[i].capacity() < spareCopies_[best].capacity()))
      best = i;
  if (best < spareCopies_.size()) {
    k.copy.swap(spareCopies_[best]);
    spareCopies_.erase(spareCopies_.begin() + long(best));
  }
  k.copy.assign(k.data, k.data + k.len);  // the caller may reuse its buffer now
  noteUnacked(keptCount_);
}

void TcpChannel::retire(Kept& k) {
  if (!k.owned) return;
  k.owned = false;
  // Kept for the next copies (a send and its reply need one; a stream a few); past that, freed.
  if (spareCopies_.size() < kSpareCopies) spareCopies_.push_back(std::move(k.copy));
  k.copy = std::vector<uint8_t>();
}

void TcpChannel::dropKept() {
  for (size_t i = 0; i < keptCount_; ++i) retire(keptAt(i));
  keptCount_ = 0;
}

void TcpChannel::releaseAcked() {
  while (keptCount_ && keptAt(0).end <= ackedAbs_) {
    retire(keptAt(0));
    keptHead_ = (keptHead_ + 1) % kept_.size();
    --keptCount_;
  }
}

void TcpChannel::noteUnacked(uint64_t n) {
  if (n > unackedMax_.load(std::memory_order_relaxed)) unackedMax_.store(n, std::memory_order_relaxed);
}

void TcpChannel::startRewind() {
  if (rewindTo_ == ~0ull) return;
  uint64_t to = rewindTo_;
  rewindTo_ = ~0ull;
  if (to >= framesSent_) return;
  // adopt() checked to >= heldFrom(). Frames before curFirst_ are kept items' (replayKept);
  // frame k of the current item starts at k * kTcpFrameBytes.
  itemRewound_ = true;
  itemFrames_ = to > curFirst_ ? size_t(to - curFirst_) : 0;
  framesSent_ = to;
}

void TcpChannel::applyRewind(SendItem& item) {
  startRewind();
  if (!itemRewound_) return;
  itemRewound_ = false;
  if (item.frames > itemFrames_) {
    item.frames = itemFrames_;
    item.offset = item.frames * kTcpFrameBytes;
  }
}

bool TcpChannel::replayKept() {
  while (framesSent_ < curFirst_) {
    const Kept* k = nullptr;
    for (size_t i = 0; i < keptCount_ && !k; ++i) {
      const Kept& e = keptAt(i);
      if (e.first <= framesSent_ && framesSent_ < e.end) k = &e;
    }
    if (!k)  // adopt() refuses a resume from before the held frames: a bug if reached
      throw PeerError(strFormat("cannot resume the link to %s: chunk %llu is no longer held", peer_.describe().c_str(),
                                (unsigned long long)framesSent_),
                      peer_.rank, false);
    size_t off = size_t(framesSent_ - k->first) * kTcpFrameBytes;
    if (!inFrame_) {
      if ((ackOff_ != 0 || ackOwed_) && !flushAck()) return false;
      beginFrame(k->len, off, k->desc);
    }
    int w = writeFrame(k->bytes() + off, "re-sending data");
    if (w == 0) return false;
    if (w < 0) {
      startRewind();
      continue;
    }
    framesSent_++;
    LinkCounters::add(counters().frames_sent, 1);
    PeerProgress::bump(progress().send_sent);
  }
  return true;
}

void TcpChannel::noteBreak(const char* during, int err) {
  breakNs_ = monoNs();
  breakDeadline_ = deadlineAfter(breakNs_, reconnect_->plan().timeout_s);
  breakWhy_ = err ? strFormat("%s: %s", during, errnoString(err).c_str())
                  : strFormat("%s: %s", during, brokeHow_.empty() ? "connection lost" : brokeHow_.c_str());
  HETOBS_WARN("link to %s broke (%s; chunks sent %llu, acknowledged %llu, received %llu); re-making it "
              "(HETOBS_RECONNECT_TIMEOUT=%g s)",
              peer_.describe().c_str(), breakWhy_.c_str(), (unsigned long long)framesSent_,
              (unsigned long long)ackedAbs_, (unsigned long long)framesRecv_, reconnect_->plan().timeout_s);
  abandon(fd_);
  fd_ = -1;
  closed_ = true;
  reconnect_->log().broke(breakWhy_);
}

int TcpChannel::dialAndNote(bool background) {
  // In the background one short try (the op that polls does not wait out a dead network here;
  // the next poll tries again), for an op the reconnect window, then the link is named down.
  int fd = background ? reconnect_->tryRemake(generation_ + 1, monoNs() + kBackgroundTryNs, peer_, breakWhy_)
                      : reconnect_->remake(generation_ + 1, breakDeadline_, peer_, breakWhy_, localEnd_, remoteEnd_);
  if (fd < 0) return -1;
  ResumeNote mine{kResumeMagic, generation_ + 1, framesRecv_};
  try {
    writeFull(fd, &mine, sizeof mine, monoNs() + kHandshakeAnswerNs, "resume note");
  } catch (const Error& e) {
    ::close(fd);
    reconnect_->log().failed("resume", e.what());
    return -1;  // the next dial tries again, or past the deadline names the link (LinkError)
  }
  return fd;
}

bool TcpChannel::finishPending(bool block) {
  try {
    if (block) {
      // Bounded like a handshake's answer: a note lost with a connection that died silently
      // is not waited for until the deadline; the link is dialled again.
      setNonBlocking(pendingFd_, false);
      readFull(pendingFd_, reinterpret_cast<char*>(&pendingNote_) + pendingOff_, sizeof pendingNote_ - pendingOff_,
               std::min(breakDeadline_, monoNs() + kHandshakeAnswerNs), "resume note");
      pendingOff_ = sizeof pendingNote_;
    }
    while (pendingOff_ < sizeof pendingNote_) {
      ssize_t n = recv(pendingFd_, reinterpret_cast<char*>(&pendingNote_) + pendingOff_,
                       sizeof pendingNote_ - pendingOff_, MSG_DONTWAIT);
      if (n > 0) {
        pendingOff_ += size_t(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && wouldBlock(errno)) return false;  // the peer takes the redial when it next polls
      throw Error(n == 0 ? "resume note: connection closed" : "resume note: " + errnoString(errno));
    }
  } catch (const Error& e) {
    ::close(pendingFd_);
    pendingFd_ = -1;
    pendingOff_ = 0;
    reconnect_->log().failed("resume", e.what());
    return false;  // as in dialAndNote
  }
  int fd = pendingFd_;
  pendingFd_ = -1;
  pendingOff_ = 0;
  adopt(fd, pendingNote_, breakNs_);
  return true;
}

bool TcpChannel::recover(const char* during, int err) {
  // Only the peer's close message is a deliberate close (eof_): the PeerError it always was.
  // Resets, timeouts and bare ends of stream are re-made; a peer whose process is gone is
  // found so by the redial (its listener refuses), a live one that closed says so there.
  if (!reconnect_ || !reconnect_->enabled() || eof_) return false;
  if (fd_ >= 0 || breakDeadline_ == 0) {
    noteBreak(during, err);
  } else {
    // A re-make begun in the background (the link broke while no op used it): this op needs
    // the link now and gets the whole reconnect window from now, as if it had just broken.
    breakDeadline_ = deadlineAfter(monoNs(), reconnect_->plan().timeout_s);
    if (pendingFd_ >= 0 && finishPending(true)) return true;
  }
  for (;;) {
    int fd = dialAndNote(false);
    if (fd < 0) continue;
    pendingFd_ = fd;
    pendingOff_ = 0;
    if (finishPending(true)) return true;
  }
}

bool TcpChannel::remakeInBackground() {
  if (pendingFd_ < 0) {
    if (fd_ >= 0 || breakDeadline_ == 0) noteBreak("while no op of this rank used the link", 0);
    int64_t now = monoNs();
    if (now < nextBackgroundTry_) return false;
    nextBackgroundTry_ = now + kBackgroundRetryNs;
    int fd = dialAndNote(true);
    if (fd < 0) return false;
    pendingFd_ = fd;
    pendingOff_ = 0;
  }
  return finishPending(false);
}

void TcpChannel::adopt(int fd, const ResumeNote& theirs, int64_t brokeAtNs) {
  if (theirs.magic != kResumeMagic) {
    ::close(fd);
    throw PeerError(strFormat("protocol error on the link to %s: bad resume note", peer_.describe().c_str()),
                    peer_.rank, false);
  }
  if (theirs.frames_recv > framesSent_ || theirs.frames_recv < heldFrom()) {
    ::close(fd);
    throw PeerError(strFormat("cannot resume the link to %s: it has %llu of this rank's chunks, this rank sent %llu "
                              "and holds the data from chunk %llu on",
                              peer_.describe().c_str(), (unsigned long long)theirs.frames_recv,
                              (unsigned long long)framesSent_, (unsigned long long)heldFrom()),
                    peer_.rank, false);
  }
  if (fd_ >= 0) abandon(fd_);
  if (pendingFd_ >= 0 && pendingFd_ != fd) {  // the peer's redial overtook our own (acceptor side: never)
    ::close(pendingFd_);
    pendingFd_ = -1;
  }
  fd_ = fd;
  breakDeadline_ = 0;
  generation_ = std::max(generation_ + 1, theirs.generation);
  closed_ = false;
  eof_ = false;
  brokeHow_.clear();
  resetSeen_ = false;
  // Receive side: a half-read frame is dropped; the peer resends it whole.
  haveHdr_ = false;
  rhdrOff_ = 0;
  rpayOff_ = 0;
  // Send side: a half-written frame is abandoned; resume at the peer's count.
  inFrame_ = false;
  frameOff_ = 0;
  ackOff_ = 0;
  ackOwed_ = true;  // confirm again what we hold: the peer's send may wait on it
  ackedAbs_ = std::max<uint64_t>(ackedAbs_, theirs.frames_recv);
  noteAcked(ackedAbs_);
  releaseAcked();
  rewindTo_ = theirs.frames_recv;
  configureSocket();
  reconnects().fetch_add(1, std::memory_order_relaxed);
  reconnect_->log().remade();
  HETOBS_WARN("link to %s re-made in %.3f s (connection %u); resuming at chunk %llu", peer_.describe().c_str(),
              double(monoNs() - brokeAtNs) / 1e9, generation_, (unsigned long long)theirs.frames_recv);
}

bool TcpChannel::readHeader() {
  while (!haveHdr_) {
    ssize_t n = recv(fd_, reinterpret_cast<char*>(&rhdr_) + rhdrOff_, sizeof rhdr_ - rhdrOff_, MSG_DONTWAIT);
    if (n == 0) {
      // No close message came: a break (its process ended, or a reset that a send read
      // first, which leaves only the end of stream here). The caller re-makes or reports it.
      markBroken("end of stream without a close message", false);
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (wouldBlock(errno)) return false;
      if (errno == ECONNRESET || errno == ETIMEDOUT || errno == EPIPE) {
        markBroken(errnoString(errno).c_str(), true);  // the caller re-makes the link or reports it
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
        checkAck(peer_, rhdr_.chunk, framesSent_, "TCP link");
        ackedAbs_ = std::max<uint64_t>(ackedAbs_, rhdr_.chunk);
        noteAcked(rhdr_.chunk);
        releaseAcked();
        continue;
      case FrameKind::kClose:
        // The peer closed the link on purpose: whatever this rank still waits for, it is not coming.
        rhdrOff_ = 0;
        closed_ = true;
        eof_ = true;
        return false;
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
      markBroken("end of stream without a close message", false);
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (wouldBlock(errno)) return false;
      markBroken(errnoString(errno).c_str(), true);
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
  if (fd_ < 0 && !recover("while this rank was receiving from it", 0))  // as in progressSend
    throwBroken("while this rank was receiving from it");
  // A resume left kept frames to re-send, and no send item may come to drive it: the peer
  // may wait for them before it sends what this item waits for.
  if (rewindTo_ != ~0ull || framesSent_ < curFirst_) {
    startRewind();
    replayKept();
  }
  for (;;) {
    if (!haveHdr_) {
      if (!readHeader()) {
        if (closed_) {
          if (!recover("while this rank was receiving from it", 0))
            throwBroken("while this rank was receiving from it");
          continue;
        }
        return false;
      }
    }
    checkFrame(peer_, rhdr_.desc(), expect);
    arrivalIn(rhdr_.arrival);
    // Frames no sender makes (out of order, past the staging buffer, ...) first: they are
    // protocol errors whatever this rank expects. A well-formed frame with more bytes than
    // the item still lacks is a peer running another op (the pipelined ring's items are one
    // frame long, so a frame past the staging buffer is also past the item).
    checkDataFrame(peer_, rhdr_, item, kTcpFrameBytes, framesRecv_, "TCP link");  // staging_ holds one frame
    if (rhdr_.bytes > item.len - item.offset)
      throw FrameMismatch(peer_.rank, rhdr_.desc(), expect,
                          strFormat("%s sent %llu more bytes than this rank expects for %s", peer_.describe().c_str(),
                                    (unsigned long long)rhdr_.bytes, expect.str().c_str()));
    uint8_t* target = item.mode == RecvMode::kCopy ? item.dst + item.offset : staging_.data();
    while (rpayOff_ < rhdr_.bytes) {
      ssize_t n = recv(fd_, target + rpayOff_, rhdr_.bytes - rpayOff_, MSG_DONTWAIT);
      if (n == 0) {
        // Cut mid-frame: never a deliberate close (that comes as a frame of its own).
        markBroken("end of stream in the middle of a message", false);
        if (!recover("receiving data", 0)) throwBroken("in the middle of a message");
        break;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (wouldBlock(errno)) return false;
        int err = errno;
        if (!recover("receiving data", err)) throwIo("receiving data", err);
        break;
      }
      rpayOff_ += size_t(n);
      LinkCounters::add(counters().bytes_recv, size_t(n));
    }
    if (!haveHdr_) continue;  // the link was re-made: the frame comes again
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
    // Inside a long message too, now and then: the sender of a point-to-point message copies
    // only what is not confirmed when its send completes (keepItem), and a resume of a long
    // collective send rewinds less. A 64-byte frame every 4 MiB.
    if (framesRecv_ - ackedOut_ >= kAckEveryFrames) {
      ackOwed_ = true;
      flushAck();
    }
  }
}

bool TcpChannel::pollControl() {
  bool changed = false;
  // The peer re-made the link (it saw the break first): take the new connection.
  if (reconnect_ && reconnect_->enabled() && !reconnect_->dialer()) {
    int fd = reconnect_->takeParked();
    if (fd >= 0) {
      if (!closed_) reconnect_->log().broke("the peer re-made the link (it saw the break first)");
      ResumeNote mine{kResumeMagic, generation_ + 1, framesRecv_}, theirs{};
      // The dialler sent its note right after the handshake: it is there, or lost (as in finishPending).
      int64_t dl = std::min(deadlineAfter(monoNs(), reconnect_->plan().timeout_s), monoNs() + kHandshakeAnswerNs);
      try {
        writeFull(fd, &mine, sizeof mine, dl, "resume note");
        readFull(fd, &theirs, sizeof theirs, dl, "resume note");
        adopt(fd, theirs, monoNs());
        changed = true;
      } catch (const PeerError&) {
        throw;
      } catch (const Error& e) {
        ::close(fd);
        reconnect_->log().failed("resume", e.what());
        HETOBS_DEBUG("resume with %s failed (%s)", peer_.describe().c_str(), e.what());
      }
    }
  }
  // The link broke and the op that noticed it (or the keepalive's reset) does not use it: the
  // peer may still wait on it (for an ack its op needs, for a point-to-point send's bytes held
  // here), and only the dialling end can re-make it. It dials now (quick once the network is
  // back) and sends its resume note, but does not wait for the peer's: a peer idle in
  // computation takes the redial only when it next polls, and this op must not wait for that.
  // What the peer sent before the break is read first: its close frame says it left on purpose.
  // A bare end of stream with nothing held here is a peer whose process ended (a network fault
  // resets): an op that needs that peer finds out, an op that does not is left alone.
  if (closed_ && !eof_ && !discarding_ && resumable() && reconnect_->dialer() &&
      (resetSeen_ || holdsUnacked() || fd_ < 0)) {
    if (!haveHdr_ && fd_ >= 0) readHeader();
    if (!eof_ && remakeInBackground()) changed = true;
  }
  if ((rewindTo_ != ~0ull || framesSent_ < curFirst_) && !discarding_ && fd_ >= 0) {  // failed: the op is over
    startRewind();
    changed |= replayKept();
  }
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
