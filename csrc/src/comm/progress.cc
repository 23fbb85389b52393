// The progress loop every algorithm runs on, and what happens when it fails. How a wait
// spins, yields and sleeps is the WaitPolicy's (wait_policy.h); the sockets' epoll set is
// the EpollSet's (epoll_set.h); what a failure leaves is the FailureState's.
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "hetobs/comm/abort.h"
#include "hetobs/comm/communicator.h"
#include "hetobs/comm/endpoint.h"
#include "hetobs/comm/exchange_feed.h"
#include "hetobs/relay/relay.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/cpu_pause.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/transport/shm/segment.h"


namespace hetobs {
namespace {

constexpr int64_t kControlNs = 20000000;  // poll every channel's control traffic this often
constexpr int64_t kResolveNs = 1000000000;  // how long to collect peers' ops after a mismatch

// Items to one peer in one direction complete in order: an item waits for earlier ones.
template <class Item>
bool blockedBehind(Item* items, size_t i) {
  for (size_t j = 0; j < i; ++j)
    if (items[j].peer == items[i].peer && !items[j].done) return true;
  return false;
}

// Drive every unfinished item once. Returns whether anything moved; clears *all if any
// item is unfinished.
template <class Item, class Progress>
bool driveItems(Item* items, size_t n, bool* all, Progress progress) {
  bool moved = false;
  for (size_t i = 0; i < n; ++i) {
    Item& it = items[i];
    if (it.done) continue;
    if (blockedBehind(items, i)) {
      *all = false;
      continue;
    }
    size_t before = it.offset + it.frames;
    if (!progress(it)) *all = false;
    moved |= it.done || it.offset + it.frames != before;
  }
  return moved;
}

}  // namespace

bool Communicator::oversubscribed() {
  return wait_.oversubscribed([this] {
    int local = 1;  // us, and every member reached over shared memory (same host)
    for (const auto& ch : channels_)
      if (ch && ch->isShm()) ++local;
    return local;
  });
}

OpDesc Communicator::descFor(int peer) const {
  if (desc_.op != OpKind::kRelay) return desc_;
  OpDesc d = desc_;
  d.seq = relayPeerSeq_[size_t(peer)];  // both ends of a link count the relays they share
  return d;
}

OpDesc Communicator::expectFrom(int peer) const {
  OpDesc e = descFor(peer);
  if (desc_.op == OpKind::kRecv) {
    e.op = OpKind::kSend;
    e.root = peer;
  }
  return e;
}

void Communicator::exchange(SendItem* sends, size_t ns, RecvItem* recvs, size_t nr) {
  const int64_t start = monoNs();
  int64_t lastMove = start;
  int64_t nextControl = start + kControlNs;
  shm::SegmentHeader* seg = segment_ ? segment_->header() : nullptr;
  bool spun = false, spunOut = false;  // this wait spun; it spun out (yielded or slept)
  for (;;) try {
    uint32_t bellSeen = seg ? seg->bell.seq.load(std::memory_order_acquire) : 0;
    bool all = true;
    bool moved = driveItems(sends, ns, &all, [&](SendItem& s) { return channels_[size_t(s.peer)]->progressSend(s, descFor(s.peer)); });
    moved |= driveItems(recvs, nr, &all,
                        [&](RecvItem& r) { return channels_[size_t(r.peer)]->progressRecv(r, expectFrom(r.peer)); });
    if (all) break;
    // A step that moved restarts the idle count; the clock is read at the next that did
    // not (an 8 B op moves its send at once, then waits: one read fewer per op).
    if (moved) {
      lastMove = -1;
      continue;
    }
    int64_t now = monoNs();
    if (lastMove < 0) lastMove = now;
    pollControlWhenDue(now, &nextControl, seg);
    if (now >= deadlineNs_) timeoutError(sends, ns, recvs, nr);
    throwIfAbortRequested();
    int64_t idle = now - lastMove;
    WaitPolicy::Step step = wait_.next(idle, anyShm_, anyShm_ && oversubscribed());
    if (step == WaitPolicy::Step::kSpin) {
      for (int i = 0; i < WaitPolicy::kPausesPerPoll; ++i) HETOBS_PAUSE();
      spun = true;
    } else if (step == WaitPolicy::Step::kYield) {
      sched_yield();
      spunOut = true;
    } else {
      waitForEvents(sends, ns, recvs, nr, bellSeen, std::min(WaitPolicy::idleSleepNs(idle), deadlineNs_ - now));
      spunOut = true;
    }
  } catch (const RemoteAbort& a) {
    if (!deferLaterMismatch(a)) throw;
  }
  wait_.adapt(spun, spunOut);
  int64_t took = monoNs() - start;
  for (size_t i = 0; i < ns; ++i) {
    auto& k = channels_[size_t(sends[i].peer)]->counters();
    k.busy_ns.store(k.busy_ns.load(std::memory_order_relaxed) + took, std::memory_order_relaxed);
  }
  for (size_t i = 0; i < nr; ++i) {
    auto& k = channels_[size_t(recvs[i].peer)]->counters();
    k.busy_ns.store(k.busy_ns.load(std::memory_order_relaxed) + took, std::memory_order_relaxed);
  }
}

void Communicator::checkDeadline() {
  if (monoNs() >= deadlineNs_) throw TimeoutError(strFormat("timed out after %.2f s", double(monoNs() - opStartNs_) / 1e9));
  throwIfAbortRequested();
}

// Peers' control frames (abort notices) are read every kControlNs while an op waits, and at
// once when a same-host peer rang the segment's abort flag.
void Communicator::pollControlWhenDue(int64_t now, int64_t* nextControl, shm::SegmentHeader* seg) {
  if (now >= *nextControl || (seg && seg->abort.load(std::memory_order_relaxed))) {
    pollAllControl();
    *nextControl = now + kControlNs;
  }
}

void Communicator::throwIfAbortRequested() const {
  if (abortRequested_.load(std::memory_order_acquire))
    throw TimeoutError("aborted by the watchdog (HETOBS_ABORT_ON_HANG=1): " + abortWhy_);
}

void Communicator::exchangeFed(ExchangeFeed& feed) {
  constexpr int64_t kCopyPollNs = 100000;  // copies pending too: wake this often to hand them on
  int64_t lastMove = monoNs();
  int64_t nextControl = lastMove + kControlNs;
  shm::SegmentHeader* seg = segment_ ? segment_->header() : nullptr;
  for (;;) try {
    uint32_t bellSeen = seg ? seg->bell.seq.load(std::memory_order_acquire) : 0;
    uint32_t copySeen = feed.copySeq();
    bool moved = feed.pump();
    if (feed.finished()) break;
    size_t ns = 0, nr = 0;
    SendItem* sends = feed.sends(&ns);
    RecvItem* recvs = feed.recvs(&nr);
    bool all = true;
    moved |= driveItems(sends, ns, &all, [&](SendItem& s) { return channels_[size_t(s.peer)]->progressSend(s, descFor(s.peer)); });
    moved |= driveItems(recvs, nr, &all,
                        [&](RecvItem& r) { return channels_[size_t(r.peer)]->progressRecv(r, expectFrom(r.peer)); });
    int64_t now = monoNs();
    if (moved) {
      lastMove = now;
      continue;
    }
    pollControlWhenDue(now, &nextControl, seg);
    if (now >= deadlineNs_) {
      if (ns + nr) timeoutError(sends, ns, recvs, nr);
      throw TimeoutError(strFormat("timed out after %.2f s waiting for the relay's staging copies",
                                   double(now - opStartNs_) / 1e9));
    }
    throwIfAbortRequested();
    int64_t idle = now - lastMove;
    bool copying = feed.copying();
    WaitPolicy::Step step = WaitPolicy::nextFed(idle, anyShm_, !copying && anyShm_ && oversubscribed(), copying);
    int64_t sleepNs = std::min(WaitPolicy::idleSleepNs(idle), deadlineNs_ - now);
    if (step == WaitPolicy::Step::kSpin) {
      for (int i = 0; i < WaitPolicy::kPausesPerPoll; ++i) HETOBS_PAUSE();
    } else if (step == WaitPolicy::Step::kYield) {
      sched_yield();
    } else if (ns + nr == 0) {
      feed.waitCopies(copySeen, sleepNs);  // only copies pending: their completion wakes us
    } else {
      waitForEvents(sends, ns, recvs, nr, bellSeen, copying ? std::min(sleepNs, kCopyPollNs) : sleepNs);
    }
  } catch (const RemoteAbort& a) {
    if (!deferLaterMismatch(a)) throw;
  }
}

void Communicator::waitForEvents(SendItem* sends, size_t ns, RecvItem* recvs, size_t nr, uint32_t bellSeen,
                                 int64_t sleepNs) {
  bool tcpPending = false, shmPending = false;
  for (size_t p = 0; p < channels_.size(); ++p) {
    Channel* ch = channels_[p].get();
    if (!ch) continue;
    uint32_t ev = 0;
    bool sendPending = false, recvPending = false;
    for (size_t i = 0; i < ns; ++i)
      if (sends[i].peer == int(p) && !sends[i].done) sendPending = true;
    for (size_t i = 0; i < nr; ++i)
      if (recvs[i].peer == int(p) && !recvs[i].done) recvPending = true;
    if (sendPending || recvPending) (ch->isShm() ? shmPending : tcpPending) = true;
    if (!ch->peerClosed()) {
      // Input is always interesting (acks, aborts, EOF, data) unless a later op's data is parked there.
      if (!ch->holdsData() || (recvPending && !ch->isShm())) ev |= EPOLLIN;
      // A send that waits for its ack (TCP with reconnect) waits on input, not on room to write.
      if (sendPending && !ch->isShm() && !ch->sendWaitsForAck()) ev |= EPOLLOUT;
      if (sendPending && ch->sendWaitsForAck()) ev |= EPOLLIN;
    }
    epoll_.setWanted(p, (recvPending || sendPending) && !ch->isShm());
    epoll_.watch(p, ch->pollFd(), ev);
  }
  if (tcpPending || !shmPending) {
    int got = epoll_.wait(shmPending ? 0 : std::max<int64_t>(1000, sleepNs));
    // Readable links the op is not using carry control traffic (acks, aborts, EOF):
    // drain it now, or the wait would keep returning at once and burn the core.
    for (int i = 0; i < got; ++i) {
      size_t p = epoll_.readySlot(i);
      if (!epoll_.wanted(p)) channels_[p]->pollControl();
    }
  }
  if (shmPending && segment_) {
    // Shared-memory peers ring only an announced waiter: look at their rings once more.
    auto moved = [&] {
      for (size_t i = 0; i < ns; ++i) {
        const Channel* ch = channels_[size_t(sends[i].peer)].get();
        if (!sends[i].done && ch->isShm() && ch->peerMovedSinceLastLook(true, false)) return true;
      }
      for (size_t i = 0; i < nr; ++i) {
        const Channel* ch = channels_[size_t(recvs[i].peer)].get();
        if (!recvs[i].done && ch->isShm() && ch->peerMovedSinceLastLook(false, true)) return true;
      }
      return false;
    };
    segment_->header()->bell.waitUnless(bellSeen, tcpPending ? 100000 : sleepNs, moved);
  }
}

void Communicator::pollAllControl() {
  for (auto& ch : channels_) {
    if (!ch) continue;
    ch->pollControl();
    // A data frame parked on a link we are not reading yet tells on its sender: if it
    // is for this op and disagrees, or is left over from an op we finished without
    // ever reading from that peer, the two ranks ran different ops at that seq.
    FrameHeader h;
    if (isP2P(desc_.op) || !ch->peekData(&h)) continue;
    OpDesc theirs = h.desc();
    if (theirs.comm_tag != desc_.comm_tag || isP2P(theirs.op)) continue;
    if (theirs.seq == desc_.seq) {
      checkFrame(ch->peer(), theirs, desc_);
    } else if (theirs.seq < desc_.seq) {
      const OpDesc& ours = history_[theirs.seq % kHistory];
      checkFrame(ch->peer(), theirs, ours.seq == theirs.seq ? ours : desc_);
    }
  }
}

void Communicator::timeoutError(SendItem* sends, size_t ns, RecvItem* recvs, size_t nr) {
  std::string waiting;
  failure_.waitedPeer = -1;
  failure_.timedOutOn.clear();
  int64_t now = monoNs();
  auto add = [&](int peer, const char* what, size_t got, size_t len) {
    if (failure_.waitedPeer < 0) failure_.waitedPeer = peer;
    if (std::find(failure_.timedOutOn.begin(), failure_.timedOutOn.end(), peer) == failure_.timedOutOn.end()) failure_.timedOutOn.push_back(peer);
    auto& ch = channels_[size_t(peer)];
    int64_t last = ch->progress().last_change_ns.load();
    waiting += strFormat("%s%s %s (%zu of %zu bytes; %s)", waiting.empty() ? "" : "; ", what,
                         ch->peer().describe().c_str(), got, len,
                         last ? strFormat("last progress %.2f s ago", double(now - last) / 1e9).c_str()
                              : "no progress in this op");
  };
  for (size_t i = 0; i < nr; ++i)
    if (!recvs[i].done) add(recvs[i].peer, "receiving from", recvs[i].offset, recvs[i].len);
  for (size_t i = 0; i < ns; ++i)
    if (!sends[i].done) add(sends[i].peer, "sending to", sends[i].offset, sends[i].len);
  throw TimeoutError(strFormat("timed out after %.2f s %s", double(now - opStartNs_) / 1e9, waiting.c_str()));
}

void Communicator::abortPeers(const AbortNotice& n) {
  std::string body = n.encode();
  for (auto& ch : channels_)
    if (ch && !ch->peerClosed()) ch->sendAbort(body);
}

bool Communicator::deferLaterMismatch(const RemoteAbort& a) {
  if (isP2P(desc_.op)) return false;
  AbortNotice got = AbortNotice::decode(a.body);
  if (got.kind != AbortKind::kMismatch || got.reporter < 0 || isP2P(got.reporter_desc.op) ||
      got.reporter_desc.seq <= desc_.seq)
    return false;
  failure_.deferredMismatch.push_back(a);  // the failure path only: no allocation while ops run well
  return true;
}

void Communicator::handleFailure(std::exception_ptr ep) {
  // Whatever stopped this op, a mismatch announced for a later one is the root cause.
  if (!failure_.deferredMismatch.empty()) {
    AbortNotice got = AbortNotice::decode(failure_.deferredMismatch.front().body);
    resolveMismatch(-1, nullptr, &got);
  }
  AbortNotice n;
  n.reporter = rank_;
  n.reporter_desc = desc_;
  n.origin = rank_;
  int from = -1;
  std::string msg;
  try {
    std::rethrow_exception(ep);
  } catch (const FrameMismatch& m) {
    resolveMismatch(m.peer, &m.theirs, nullptr);
  } catch (const RelayMismatch& e) {
    // Both ends of the link see the disagreement in the headers they exchanged: each
    // names the other. The peer's notice says why, should it get there first.
    n.kind = AbortKind::kOther;
    n.cause = strFormat("rank %d: %s", rank_, e.what());
    msg = strFormat("%s: %s", opContext().c_str(), e.what());
    failWith(n, msg);
    throw MismatchError(msg);
  } catch (const RemoteAbort& a) {
    AbortNotice got = AbortNotice::decode(a.body);
    if (got.kind == AbortKind::kMismatch && got.reporter >= 0) resolveMismatch(-1, nullptr, &got);
    n.kind = got.kind;
    n.cause = got.cause;  // forward the root cause unchanged, so chains never grow
    n.origin = got.origin >= 0 ? got.origin : a.peer;
    n.suspect = got.suspect;
    from = a.peer;
    msg = strFormat("%s: aborted by %s: %s", opContext().c_str(), channels_[size_t(a.peer)]->peer().describe().c_str(),
                    got.cause.c_str());
  } catch (const TimeoutError& e) {
    n.kind = AbortKind::kTimeout;
    n.suspect = failure_.waitedPeer;
    n.cause = strFormat("rank %d timed out in %s: %s", rank_, desc_.str().c_str(), e.what());
    msg = strFormat("%s: %s", opContext().c_str(), e.what());
    failWith(n, msg);
    throw TimeoutError(msg);
  } catch (const PeerError& e) {
    n.kind = e.closed ? AbortKind::kPeer : AbortKind::kTransport;
    n.suspect = e.peer;
    if (e.gone && e.peer >= 0 && e.peer < size()) failure_.gonePeer = e.peer;
    n.cause = e.what();
    msg = strFormat("%s: %s", opContext().c_str(), e.what());
  } catch (const std::exception& e) {
    n.kind = AbortKind::kOther;
    n.cause = strFormat("rank %d failed: %s", rank_, e.what());
    msg = strFormat("%s: %s", opContext().c_str(), e.what());
  }
  failWith(n, msg, from);
  throw PeerError(msg);
}

void Communicator::failWith(const AbortNotice& n, const std::string& msg, int from) {
  failure_.record(n, msg, from, desc_.seq);
  failure_.failed.store(true);
  endpoint_->listener().markClosed(id_);  // a peer cut off from the abort notice hears "closed" if it redials
  abortPeers(n);
  HETOBS_WARN("%s", msg.c_str());
  reportFailure(msg, desc_.seq);
}

void Communicator::resolveMismatch(int directPeer, const OpDesc* directTheirs, const AbortNotice* notice) {
  // Collect every rank's own op (first-hand reports win over second-hand ones), then
  // let the majority decide who deviated. No rank is trusted as the reference.
  std::map<int, OpDesc> firsthand, secondhand;
  // Judge the op at the seq where the mismatch was seen, which this rank may have
  // finished already (its part of the data flow never touched the deviator).
  OpDesc ours = desc_;
  uint64_t seq = notice ? notice->reporter_desc.seq
                        : (directTheirs && directTheirs->seq < desc_.seq ? directTheirs->seq : desc_.seq);
  if (seq != desc_.seq && !isP2P(desc_.op) && history_[seq % kHistory].seq == seq) ours = history_[seq % kHistory];
  // A rank still behind that seq (slow, not deviating) cannot say what it will call there:
  // it does not vote. What a peer's frames showed (second hand) counts whatever its seq.
  if (ours.seq == seq) firsthand[rank_] = ours;
  if (directTheirs) secondhand[directPeer] = *directTheirs;
  if (notice) {
    if (notice->reporter_desc.seq == seq) firsthand[notice->reporter] = notice->reporter_desc;
    if (notice->suspect >= 0) secondhand.emplace(notice->suspect, notice->suspect_desc);
  }
  for (const RemoteAbort& a : failure_.deferredMismatch) {  // votes that came while an earlier op ran
    AbortNotice got = AbortNotice::decode(a.body);
    if (got.reporter_desc.seq == seq) firsthand[got.reporter] = got.reporter_desc;
    if (got.suspect >= 0) secondhand.emplace(got.suspect, got.suspect_desc);
  }
  failure_.deferredMismatch.clear();
  AbortNotice mine;
  mine.kind = AbortKind::kMismatch;
  mine.reporter = rank_;
  mine.reporter_desc = ours;
  mine.suspect = directTheirs ? directPeer : -1;
  if (directTheirs) mine.suspect_desc = *directTheirs;
  mine.cause = directTheirs ? strFormat("rank %d saw rank %d run %s while it runs %s", rank_, directPeer,
                                        directTheirs->str().c_str(), desc_.str().c_str())
                            : "op mismatch";
  mine.origin = notice ? notice->origin : rank_;
  failure_.notice = mine;
  failure_.seq = seq;
  if (notice) failure_.notice.suspect = notice->suspect;
  failure_.from = notice ? notice->reporter : -1;
  failure_.failed.store(true);
  abortPeers(mine);
  for (auto& ch : channels_)
    if (ch) ch->discardData();
  int64_t until = monoNs() + std::min<int64_t>(kResolveNs, std::max<int64_t>(deadlineNs_ - monoNs(), 200000000));
  auto heard = [&] {
    size_t n = firsthand.size();
    for (auto& kv : secondhand) n += firsthand.count(kv.first) ? 0 : 1;
    return int(n);
  };
  while (monoNs() < until && heard() < size()) {
    std::vector<pollfd> fds;
    for (auto& ch : channels_) {
      if (!ch || ch->peerClosed() || firsthand.count(ch->peer().rank)) continue;
      try {
        ch->pollControl();
      } catch (const RemoteAbort& a) {
        AbortNotice got = AbortNotice::decode(a.body);
        if (got.reporter >= 0) {
          if ((got.kind == AbortKind::kMismatch || got.reporter == a.peer) && got.reporter_desc.seq == seq)
            firsthand[got.reporter] = got.reporter_desc;
          if (got.kind == AbortKind::kMismatch && got.suspect >= 0) secondhand.emplace(got.suspect, got.suspect_desc);
        }
        continue;
      } catch (const Error&) {
        continue;
      }
      if (!ch->peerClosed()) fds.push_back(pollfd{ch->pollFd(), POLLIN, 0});
    }
    if (fds.empty()) break;
    poll(fds.data(), fds.size(), 5);
  }
  for (auto& kv : secondhand) firsthand.emplace(kv.first, kv.second);

  MismatchVote vote = MismatchVote::tally(firsthand);
  if (vote.majority()) {
    for (int d : vote.deviating()) failure_.deviating.push_back(worldRanks()[size_t(d)]);
    failure_.voted.store(true, std::memory_order_release);
  }
  std::string msg = vote.describe(id_, rank_, notice ? notice->cause : mine.cause);
  failure_.cause = msg;
  HETOBS_WARN("%s", msg.c_str());
  reportFailure(msg, seq);
  throw MismatchError(msg);
}

}  // namespace hetobs
