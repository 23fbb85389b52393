#include "hetobs/transport/channel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>

#include "hetobs/common/clock.h"
#include "hetobs/common/json.h"

namespace hetobs {

Channel::Channel(PeerInfo peer)
    : peer_(std::move(peer)), ownStats_(std::make_unique<stats::LinkStats>()), stats_(ownStats_.get()) {}

void Channel::bindStats(stats::LinkStats* slot, uint64_t commId) {
  if (slot) stats_ = slot;
  stats_->comm_id = commId;
  stats_->peer = peer_.rank;
  stats_->global_peer = peer_.global_rank;
  snprintf(stats_->transport, sizeof stats_->transport, "%s", kind());
}

namespace {
std::string sockName(int fd, bool peer) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len)
                : getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  if (rc != 0) return "";
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(sa.sin_port));
}
}  // namespace

void Channel::noteSendStart(SendItem& item) {
  if (item.started) return;
  item.started = true;
  if (progress().send_posted.load(std::memory_order_relaxed) == 0) sentBase_ = framesSent_;
  PeerProgress::bump(progress().send_posted);
}

void Channel::noteRecvStart(RecvItem& item) {
  if (item.started) return;
  item.started = true;
  PeerProgress::bump(progress().recv_posted);
}

void Channel::noteFrameSent(SendItem& item, size_t payload) {
  item.offset += payload;
  item.frames++;
  framesSent_++;
  LinkCounters::add(counters().frames_sent, 1);
  PeerProgress::bump(progress().send_sent);
}

void Channel::noteFrameReceived(RecvItem& item, size_t payload) {
  item.offset += payload;
  item.frames++;
  framesRecv_++;
  LinkCounters::add(counters().frames_recv, 1);
  PeerProgress::bump(progress().recv_received);
  noteActivity();
}

void Channel::noteAcked(uint64_t framesConfirmed) {
  progress().send_acked.store(framesConfirmed > sentBase_ ? framesConfirmed - sentBase_ : 0,
                              std::memory_order_relaxed);
}

bool Channel::noteSendDone(SendItem& item) {
  item.done = true;
  PeerProgress::bump(progress().send_done);
  noteActivity();
  return true;
}

void Channel::noteRecvDone(RecvItem& item) {
  item.done = true;
  PeerProgress::bump(progress().recv_done);
}

void Channel::noteActivity() {
  int64_t now = monoCoarseNs();  // read in seconds (progress, hang diagnosis), written per frame
  progress().last_change_ns.store(now, std::memory_order_relaxed);
  counters().last_activity_ns.store(now, std::memory_order_relaxed);
}

void Channel::readPeerMemory(uint64_t, void*, size_t) {
  throw Error(strFormat("the link to %s cannot read the peer's memory (%s)", peer_.describe().c_str(), kind()));
}

void Channel::writePeerMemory(uint64_t, const void*, size_t) {
  throw Error(strFormat("the link to %s cannot write the peer's memory (%s)", peer_.describe().c_str(), kind()));
}

std::string Channel::localAddress() const { return sockName(pollFd(), false); }
std::string Channel::remoteAddress() const { return sockName(pollFd(), true); }

std::string PeerInfo::describe() const {
  return strFormat("rank %d (host %s, pid %d)", rank, host.c_str(), pid);
}

std::string abortFrame(const std::string& body) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.kind = uint8_t(FrameKind::kAbort);
  h.bytes = utf8PrefixLen(body.data(), body.size(), kMaxAbortBody);  // never half a character
  std::string buf(reinterpret_cast<char*>(&h), sizeof h);
  buf.append(body, 0, size_t(h.bytes));
  return buf;
}

void checkFrame(const PeerInfo& peer, const OpDesc& theirs, const OpDesc& expect) {
  if (theirs == expect) return;
  throw FrameMismatch(peer.rank, theirs, expect,
                      strFormat("%s sent %s; this rank runs %s", peer.describe().c_str(), theirs.str().c_str(),
                                expect.str().c_str()));
}

}  // namespace hetobs
