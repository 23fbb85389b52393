#include "hetobs/transport/shm/channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "hetobs/collectives/reduce_kernels.h"
#include "hetobs/common/asymmetric_fence.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"
#include "hetobs/transport/frame_check.h"
#include "hetobs/transport/shm/single_copy.h"

namespace hetobs {
namespace shm {
namespace {
constexpr uint64_t kAlign = 64;
inline uint64_t roundUp(uint64_t v) { return (v + kAlign - 1) & ~(kAlign - 1); }
constexpr uint64_t kSingleCopyOff = 1ull << 62;  // HETOBS_SHM_SINGLE_COPY_BYTES' "never"
// A reduction reads the peer's bytes into this much private memory, then folds them from
// there while they are still in cache (process_vm_readv cannot reduce as it copies).
constexpr size_t kReduceBufBytes = 256 * 1024;
// A message goes in at least this many frames (none under kMinPieceBytes): the receiver
// copies frame k out while the sender copies frame k+1 in. Whole, a 64 KiB-1 MiB message
// was two copies one after the other (2-rank broadcast at 0.46-0.66x Open MPI's).
constexpr uint64_t kPiecesPerMessage = 4;
constexpr uint64_t kMinPieceBytes = 16 * 1024;
std::atomic<bool> refusalLogged{false};

FrameHeader dataHeader(const OpDesc& desc, uint64_t chunk, uint64_t bytes, uint64_t arrival = 0) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.kind = uint8_t(FrameKind::kData);
  h.setDesc(desc);
  h.chunk = chunk;
  h.bytes = bytes;
  h.arrival = arrival;
  return h;
}

// Write `h` into a slot the peer polls (mail, push_to) and publish it: every word but the chunk
// word (never read here: a read would wait for the peer's core to hand the line back), then
// `chunk` into the chunk word (release), which the peer waits to see.
void publishSlot(FrameHeader& slot, const FrameHeader& h, uint64_t chunk) {
  constexpr size_t kChunkAt = offsetof(FrameHeader, chunk), kAfter = kChunkAt + sizeof h.chunk;
  auto* to = reinterpret_cast<uint8_t*>(&slot);
  const auto* from = reinterpret_cast<const uint8_t*>(&h);
  memcpy(to, from, kChunkAt);
  memcpy(to + kAfter, from + kAfter, sizeof h - kAfter);
  __atomic_store_n(&slot.chunk, chunk, __ATOMIC_RELEASE);
}
}  // namespace

ShmChannel::ShmChannel(PeerInfo peer, int controlFd, Segment* mine, std::shared_ptr<Segment> theirs,
                       uint32_t outSlot, uint32_t inSlot)
    : Channel(std::move(peer)), ctl_(controlFd), mine_(mine), theirs_(std::move(theirs)) {
  out_ = theirs_->ring(outSlot);
  outData_ = theirs_->data(outSlot);
  in_ = mine_->ring(inSlot);
  inData_ = mine_->data(inSlot);
  cap_ = mine_->ringBytes();
  // Several frames in flight let the receiver drain one while the sender fills the next.
  maxPiece_ = std::max<uint64_t>(kAlign, cap_ / 4);
  // Registers this process for membarriers (asymmetric_fence.h) before its first ring.
  lightFence_ = asymmetricFencesAvailable() && theirs_->header()->bell.heavy_waiter.load(std::memory_order_acquire) == 1;
  head_ = out_->head.load(std::memory_order_relaxed);
  seenOutTail_ = out_->tail.load(std::memory_order_relaxed);
  tail_ = in_->tail.load(std::memory_order_relaxed);
  setNonBlocking(ctl_, true);
  if (shmSingleCopyBytes() < kSingleCopyOff) {
    std::string why;
    const SegmentHeader* h = theirs_->header();
    if (canReadPeer(h->owner_pid, h->probe_addr, h->probe_value, &why)) {
      readsPeer_ = true;
      peerPid_ = h->owner_pid;
      reduceBuf_.resize(kReduceBufBytes);
      in_->single_copy.store(1, std::memory_order_release);  // the peer may now name its buffers
    } else if (!refusalLogged.exchange(true)) {
      HETOBS_DEBUG("shared memory from %s: two copies (ring), no single copy: %s", peer_.describe().c_str(),
                   why.c_str());
    }
  }
}

ShmChannel::~ShmChannel() {
  if (ctl_ >= 0) ::close(ctl_);
}

void ShmChannel::throwClosed(const char* during) {
  throw PeerError(strFormat("%s closed its connection (%s)", peer_.describe().c_str(), during), peer_.rank, true);
}

void ShmChannel::copyIn(uint64_t pos, const void* src, size_t len) {
  uint64_t off = pos % cap_;
  size_t first = size_t(std::min<uint64_t>(len, cap_ - off));
  memcpy(outData_ + off, src, first);
  if (first < len) memcpy(outData_, static_cast<const uint8_t*>(src) + first, len - first);
}

uint64_t ShmChannel::outRoom(uint64_t wanted) {
  // The peer's tail as last seen, read again only when that leaves less than `wanted`.
  if (cap_ - (head_ - seenOutTail_) < wanted) seenOutTail_ = out_->tail.load(std::memory_order_acquire);
  return cap_ - (head_ - seenOutTail_);
}

void ShmChannel::publishFrame(const FrameHeader& h, const uint8_t* payload) {
  copyIn(head_, &h, sizeof h);  // never wraps: positions and capacity are 64-aligned
  if (payload && h.bytes) copyIn(head_ + kAlign, payload, size_t(h.bytes));
  head_ += kAlign + (payload ? roundUp(h.bytes) : 0);
  out_->head.store(head_, std::memory_order_release);
  theirs_->header()->bell.ringIfWaiting(lightFence_);
}

void ShmChannel::copyOut(uint64_t pos, void* dst, size_t len) const {
  uint64_t off = pos % cap_;
  size_t first = size_t(std::min<uint64_t>(len, cap_ - off));
  memcpy(dst, inData_ + off, first);
  if (first < len) memcpy(static_cast<uint8_t*>(dst) + first, inData_, len - first);
}

bool ShmChannel::progressSend(SendItem& item, const OpDesc& desc) {
  if (item.done) return true;
  noteSendStart(item);
  bool moved = false;
  const bool named = sendsSingleCopy(item, desc);
  // Whether to push is settled with the first frame, which carries the offer.
  if (item.frames == 0) {
    awaitingPushTo_ = named && pushes(item);
    pushAt_ = !awaitingPushTo_ ? 0 : item.pushAll ? 0 : pushStart(item.len);
  }
  while (!(item.offset == item.len && item.frames > 0)) {
    if (awaitingPushTo_ && item.frames > 0 && item.offset == pushAt_) {  // offered, and named what it reads
      if (!pushRest(item, desc)) break;
      moved = true;
      continue;
    }
    uint64_t left = (awaitingPushTo_ ? pushAt_ : item.len) - item.offset;
    uint64_t piece = std::min(left, named ? kSingleCopyPiece : pieceBytes(item.len));
    if (!named && piece <= kMailPayload && postMail(item, desc, piece)) {
      moved = true;
      continue;
    }
    const uint64_t wanted = named ? kAlign : kAlign + roundUp(piece);
    uint64_t freeBytes = outRoom(wanted);
    if (named) {
      if (freeBytes < kAlign) break;
    } else if (freeBytes < wanted) {
      if (freeBytes <= kAlign) break;
      piece = std::min(piece, (freeBytes - kAlign) & ~(kAlign - 1));
      if (piece == 0) break;
    }
    if (closed_) throwClosed("while this rank was sending");
    FrameHeader h = dataHeader(desc, framesSent_, piece, arrivalOut());
    if (named)  // the ring carries the header; the peer reads the bytes from our buffer
      h.aux = markedAux(awaitingPushTo_ && item.frames == 0 ? kPushOfferMark : kSingleCopyMark, item.data + item.offset);
    publishFrame(h, named ? nullptr : item.data + item.offset);
    LinkCounters::add(counters().bytes_sent, piece);
    noteFrameSent(item, size_t(piece));
    if (named) namedUntil_ = framesSent_;
    moved = true;
  }
  // All of it went out and no named buffer of ours waits for the peer: done without reading the
  // peer's acknowledgement line, which its core writes per frame (three such reads per 8 B
  // all_reduce at 4 ranks cost ~15% of it: docs/PERF.md "Toward the limit"). Mail slots read it
  // when they run short (postMail), and pollControl() brings the op's acked count up to date
  // while the op waits, for dumps.
  if (item.offset == item.len && item.frames > 0 && namedUntil_ <= seenAcked_) return noteSendDone(item);
  // Acquire: the peer's reads of our buffer happened before it acknowledged them.
  uint64_t acked = out_->consumed_frames.load(std::memory_order_acquire);
  noteAcked(acked);
  seenAcked_ = acked;  // also frees mail slots for the next send (postMail) without a read of its own
  if (item.offset == item.len && item.frames > 0 && acked >= namedUntil_) return noteSendDone(item);
  seenOutTail_ = out_->tail.load(std::memory_order_acquire);
  if (moved) noteActivity();
  if (closed_) throwClosed("while this rank was sending");
  return false;
}

bool ShmChannel::progressRecv(RecvItem& item, const OpDesc& expect) {
  if (item.done) return true;
  noteRecvStart(item);
  while (!item.done) {
    // The head first: a ring frame published after a mail frame makes that mail visible to
    // the look below, so frames are taken in their order whichever way they came.
    uint64_t head = in_->head.load(std::memory_order_acquire);
    if (takeMail(item, expect)) continue;
    if (head == tail_) break;
    // The ring's head is the peer's word: never read past the ring or what it published.
    if (head < tail_ + kAlign || head - tail_ > cap_)
      throw PeerError(strFormat("protocol error in shared memory from %s: ring head %llu is not a frame "
                                "past the tail (tail %llu, %llu bytes)", peer_.describe().c_str(), (unsigned long long)head,
                                (unsigned long long)tail_, (unsigned long long)cap_),
                      peer_.rank, false);
    FrameHeader h;
    copyOut(tail_, &h, sizeof h);
    checkIncoming(h, item, expect);
    const uint64_t mark = markOf(h.aux);
    const bool offer = mark == kPushOfferMark, pushed = mark == kPushedMark;
    const bool named = mark == kSingleCopyMark || offer;
    if (mark != 0 && !offer && !pushed && !named)
      throw PeerError(strFormat("protocol error in shared memory from %s: a frame with the unknown mark 0x%02llx",
                                peer_.describe().c_str(), (unsigned long long)mark),
                      peer_.rank, false);
    if (named && !readsPeer_)
      throw PeerError(strFormat("protocol error in shared memory from %s: a frame names the sender's buffer, but "
                                "this rank never said it can read it", peer_.describe().c_str()),
                      peer_.rank, false);
    if (pushed) checkPushed(item, h);
    // within what it published (a named frame: within one piece; a pushed one: in place already)
    checkDataFrame(peer_, h, item, named ? kSingleCopyPiece : pushed ? h.bytes : head - tail_ - kAlign, framesRecv_,
                   "shared-memory link", /*emptyOk=*/offer);  // an offer to push all of it names nothing
    if (offer) answerPushOffer(item, expect);
    uint64_t pos = tail_ + kAlign;
    size_t len = size_t(h.bytes);
    if (named) {
      receiveSingleCopy(item, h);
    } else if (pushed) {
      LinkCounters::add(singleCopyBytes_, len);  // the sender wrote them into place itself: one copy
    } else if (item.mode == RecvMode::kCopy) {
      copyOut(pos, item.dst + item.offset, len);
    } else if (len) {
      // Reduce straight from the ring; a frame crossing the end is done in two parts
      // (the split falls on a 64-byte boundary, so on an element boundary).
      size_t es = dtypeSize(item.dtype);
      uint64_t off = pos % cap_;
      size_t first = size_t(std::min<uint64_t>(len, cap_ - off));
      reduceInto(item.dtype, item.redop, item.dst + item.offset, item.local + item.offset, inData_ + off, first / es);
      if (first < len)
        reduceInto(item.dtype, item.redop, item.dst + item.offset + first, item.local + item.offset + first, inData_,
                   (len - first) / es);
    }
    tail_ += kAlign + (named || pushed ? 0 : roundUp(h.bytes));
    in_->tail.store(tail_, std::memory_order_release);
    finishFrame(item, len);
  }
  if (item.done) return true;
  if (closed_ && in_->head.load(std::memory_order_acquire) == tail_ && !mailWaiting())
    throwClosed("while this rank was receiving from it");
  return false;
}

void ShmChannel::checkIncoming(const FrameHeader& h, const RecvItem& item, const OpDesc& expect) const {
  if (h.magic != kFrameMagic)
    throw PeerError(strFormat("protocol error in shared memory from %s: bad frame magic 0x%08x",
                              peer_.describe().c_str(), h.magic),
                    peer_.rank, false);
  checkFrame(peer_, h.desc(), expect);
  arrivalIn(h.arrival);
  if (h.bytes > item.len - item.offset)
    throw FrameMismatch(peer_.rank, h.desc(), expect,
                        strFormat("%s sent %llu more bytes than this rank expects for %s", peer_.describe().c_str(),
                                  (unsigned long long)h.bytes, expect.str().c_str()));
}

void ShmChannel::finishFrame(RecvItem& item, size_t len) {
  LinkCounters::add(counters().bytes_recv, len);
  noteFrameReceived(item, len);
  in_->consumed_frames.store(framesRecv_, std::memory_order_release);
  theirs_->header()->bell.ringIfWaiting(lightFence_);  // the sender may wait for space, acks or a mail slot
  if (item.offset == item.len) noteRecvDone(item);
}

bool ShmChannel::pushes(const SendItem& item) const {
  // Writing into the peer takes the access that reading it does (ptrace's, checked at set-up).
  return item.mayPush && readsPeer_ && item.len >= kPushMinBytes;
}

bool ShmChannel::pushRest(SendItem& item, const OpDesc& desc) {
  // Room for the frame that says the rest is in place, before the rest is written.
  if (outRoom(kAlign) < kAlign) return false;
  const FrameHeader& slot = in_->push_to;
  if (__atomic_load_n(&slot.chunk, __ATOMIC_ACQUIRE) != pushOffers_ + 1) return false;
  FrameHeader to;
  memcpy(&to, &slot, sizeof to);  // the peer answers our next offer only after this op
  const uint64_t len = item.len - pushAt_;
  if (to.magic != kFrameMagic || to.desc() != desc || to.bytes != item.len)
    throw PeerError(strFormat("protocol error in shared memory from %s: its answer to our offer to write into its "
                              "buffer of %llu bytes for %s says %llu bytes for %s",
                              peer_.describe().c_str(), (unsigned long long)item.len, desc.str().c_str(),
                              (unsigned long long)to.bytes, to.desc().str().c_str()),
                    peer_.rank, false);
  ++pushOffers_;
  awaitingPushTo_ = false;
  // Piece by piece, each also copied to alsoCopyTo while it is in this core's cache.
  for (uint64_t at = pushAt_; at < item.len; at += kPushPiece) {
    const size_t n = size_t(std::min<uint64_t>(kPushPiece, item.len - at));
    if (item.alsoCopyTo) {
      memcpy(item.alsoCopyTo + at, item.data + at, n);
      item.alsoCopied = size_t(at) + n;
    }
    mustWrite(to.aux + at, item.data + at, n);
  }
  LinkCounters::add(pushBytes_, len);
  FrameHeader h = dataHeader(desc, framesSent_, len, arrivalOut());
  h.aux = kPushedMark << kMarkShift;
  publishFrame(h, nullptr);
  LinkCounters::add(counters().bytes_sent, len);
  noteFrameSent(item, size_t(len));
  namedUntil_ = framesSent_;
  return true;
}

void ShmChannel::answerPushOffer(const RecvItem& item, const OpDesc& expect) {
  if (item.mode != RecvMode::kCopy || item.offset != 0 || expectPushed_)
    throw PeerError(strFormat("protocol error in shared memory from %s: an offer to write into this rank's buffer "
                              "for %s, which %s", peer_.describe().c_str(), expect.str().c_str(),
                              item.mode != RecvMode::kCopy ? "is a reduction" : "is not at its start"),
                    peer_.rank, false);
  // The whole buffer: the sender knows where its pushed part starts.
  FrameHeader to = dataHeader(expect, 0, item.len);
  to.aux = reinterpret_cast<uint64_t>(item.dst);
  publishSlot(out_->push_to, to, ++pushAnswers_);
  theirs_->header()->bell.ringIfWaiting(lightFence_);
  expectPushed_ = true;
}

void ShmChannel::checkPushed(const RecvItem& item, const FrameHeader& h) {
  if (!expectPushed_ || h.bytes != item.len - item.offset)
    throw PeerError(strFormat("protocol error in shared memory from %s: a frame says %llu bytes were written into "
                              "this rank's buffer, which it %s", peer_.describe().c_str(),
                              (unsigned long long)h.bytes, expectPushed_ ? "did not offer at that place" : "never offered"),
                    peer_.rank, false);
  expectPushed_ = false;
}

bool ShmChannel::postMail(SendItem& item, const OpDesc& desc, uint64_t piece) {
  const uint64_t chunk = framesSent_;
  // Slot chunk % kMailSlots last held frame chunk - kMailSlots: free once that one is acknowledged.
  if (chunk - seenAcked_ >= kMailSlots) {
    seenAcked_ = out_->consumed_frames.load(std::memory_order_acquire);
    if (chunk - seenAcked_ >= kMailSlots) return false;
  }
  if (closed_) throwClosed("while this rank was sending");
  FrameHeader h = dataHeader(desc, chunk, piece, arrivalOut());
  if (piece) memcpy(&h.aux, item.data + item.offset, size_t(piece));
  publishSlot(out_->mail[chunk % kMailSlots], h, chunk);
  theirs_->header()->bell.ringIfWaiting(lightFence_);
  LinkCounters::add(counters().bytes_sent, piece);
  noteFrameSent(item, size_t(piece));
  return true;
}

bool ShmChannel::mailWaiting() const {
  return __atomic_load_n(&in_->mail[framesRecv_ % kMailSlots].chunk, __ATOMIC_ACQUIRE) == framesRecv_;
}

bool ShmChannel::takeMail(RecvItem& item, const OpDesc& expect) {
  if (!mailWaiting()) return false;
  FrameHeader h;
  memcpy(&h, &in_->mail[framesRecv_ % kMailSlots], sizeof h);  // the producer leaves it alone until we acknowledge
  checkIncoming(h, item, expect);
  checkDataFrame(peer_, h, item, kMailPayload, framesRecv_, "shared-memory link");
  const size_t len = size_t(h.bytes);
  const auto* payload = reinterpret_cast<const uint8_t*>(&h.aux);
  if (len && item.mode == RecvMode::kCopy) memcpy(item.dst + item.offset, payload, len);
  else if (len)
    reduceInto(item.dtype, item.redop, item.dst + item.offset, item.local + item.offset, payload,
               len / dtypeSize(item.dtype));
  finishFrame(item, len);
  return true;
}

uint64_t ShmChannel::pieceBytes(size_t len) const {
  uint64_t quarter = roundUp((uint64_t(len) + kPiecesPerMessage - 1) / kPiecesPerMessage);
  return std::min(maxPiece_, std::max(kMinPieceBytes, quarter));
}

bool ShmChannel::sendsSingleCopy(const SendItem& item, const OpDesc& desc) const {
  // Collectives only: a point-to-point send finishes on its own while its message fits in
  // the ring, and a program may rely on that (send before recv on both ends); a named
  // buffer waits for the receiver.
  return (item.peerMayRead || pushes(item)) && item.len > 0 && item.len >= shmSingleCopyBytes() &&
         !isP2P(desc.op) && out_->single_copy.load(std::memory_order_acquire) == 1;
}

void ShmChannel::receiveSingleCopy(RecvItem& item, const FrameHeader& h) {
  const size_t len = size_t(h.bytes);
  const uint64_t addr = addrOf(h.aux);
  if (item.mode == RecvMode::kCopy) {
    mustRead(addr, item.dst + item.offset, len);
  } else {
    const size_t es = dtypeSize(item.dtype);
    for (size_t done = 0; done < len;) {
      size_t n = std::min(len - done, reduceBuf_.size());
      mustRead(addr + done, reduceBuf_.data(), n);
      reduceInto(item.dtype, item.redop, item.dst + item.offset + done, item.local + item.offset + done,
                 reduceBuf_.data(), n / es);
      done += n;
    }
  }
  LinkCounters::add(singleCopyBytes_, len);
}

void ShmChannel::mustRead(uint64_t addr, void* dst, size_t len) const {
  if (int err = readPeer(peerPid_, addr, dst, len))
    throw PeerError(strFormat("cannot read %zu bytes of %s's buffer (shared-memory single copy): %s", len,
                              peer_.describe().c_str(), errnoString(err).c_str()),
                    peer_.rank, err == ESRCH);
}

void ShmChannel::mustWrite(uint64_t addr, const void* src, size_t len) const {
  if (int err = writePeer(peerPid_, addr, src, len))
    throw PeerError(strFormat("cannot write %zu bytes into %s's buffer (shared-memory push): %s", len,
                              peer_.describe().c_str(), errnoString(err).c_str()),
                    peer_.rank, err == ESRCH);
}

void ShmChannel::readPeerMemory(uint64_t addr, void* dst, size_t len) {
  mustRead(addr, dst, len);
  LinkCounters::add(singleCopyBytes_, len);
  LinkCounters::add(counters().bytes_recv, len);
  noteActivity();
}

void ShmChannel::writePeerMemory(uint64_t addr, const void* src, size_t len) {
  mustWrite(addr, src, len);
  LinkCounters::add(pushBytes_, len);
  LinkCounters::add(counters().bytes_sent, len);
  noteActivity();
}

bool ShmChannel::pollControl() {
  bool changed = false;
  // Sends that finished without reading the peer's acknowledgements (progressSend): this op's
  // acked count, for a dump of an op that waits. Before the op's first send the count belongs
  // to the op before it, so only after one.
  if (progress().send_posted.load(std::memory_order_relaxed) > 0)
    noteAcked(out_->consumed_frames.load(std::memory_order_acquire));
  if (!closed_) {
    FrameHeader h;
    ssize_t n = recv(ctl_, &h, sizeof h, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      closed_ = true;
      changed = true;
    } else if (n == ssize_t(sizeof h)) {
      // Only abort notices travel on the control socket of a shared-memory link.
      setNonBlocking(ctl_, false);
      std::string body;
      try {
        readFull(ctl_, &h, sizeof h, monoNs() + 500000000LL, "abort notice");
        if (h.magic != kFrameMagic || FrameKind(h.kind) != FrameKind::kAbort)
          throw PeerError(strFormat("protocol error on the control link to %s", peer_.describe().c_str()), peer_.rank,
                          false);
        body.assign(std::min<size_t>(h.bytes, kMaxAbortBody), '\0');
        readFull(ctl_, body.data(), body.size(), monoNs() + 500000000LL, "abort notice");
      } catch (const PeerError&) {
        setNonBlocking(ctl_, true);
        throw;
      } catch (const Error&) {
        body = "(abort notice truncated)";
      }
      setNonBlocking(ctl_, true);
      throw RemoteAbort(peer_.rank, body);
    }
  }
  return changed;
}

bool ShmChannel::peerMovedSinceLastLook(bool sending, bool receiving) const {
  if (receiving && (in_->head.load(std::memory_order_acquire) != tail_ || mailWaiting())) return true;
  if (sending && awaitingPushTo_ && __atomic_load_n(&in_->push_to.chunk, __ATOMIC_ACQUIRE) == pushOffers_ + 1)
    return true;
  return sending && (out_->tail.load(std::memory_order_acquire) != seenOutTail_ ||
                     out_->consumed_frames.load(std::memory_order_acquire) != seenAcked_);
}

bool ShmChannel::peekData(FrameHeader* out) {
  uint64_t head = in_->head.load(std::memory_order_acquire);  // before the mail: as progressRecv looks
  if (mailWaiting()) {
    memcpy(out, &in_->mail[framesRecv_ % kMailSlots], sizeof *out);
    return out->magic == kFrameMagic;
  }
  if (head == tail_) return false;
  copyOut(tail_, out, sizeof *out);
  return out->magic == kFrameMagic;
}

void ShmChannel::sendAbort(const std::string& body) {
  theirs_->header()->abort.store(1, std::memory_order_release);
  theirs_->header()->bell.ring();
  std::string buf = abortFrame(body);
  try {
    writeFull(ctl_, buf.data(), buf.size(), monoNs() + 300000000LL, "abort");
  } catch (const Error& e) {
    HETOBS_DEBUG("could not send abort notice to %s: %s", peer_.describe().c_str(), e.what());
  }
}

}  // namespace shm
}  // namespace hetobs
