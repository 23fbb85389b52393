#include "hetobs/relay/pipeline.h"

#include <sched.h>

#include <algorithm>

#include "hetobs/common/clock.h"

namespace hetobs {

std::vector<RelayChunk> cutIntoChunks(const std::vector<RelayMessage>& msgs, size_t chunk) {
  // Per peer, in message order; then peers interleaved one chunk at a time.
  std::vector<std::vector<RelayChunk>> byPeer;
  std::vector<int> peers;
  for (const RelayMessage& m : msgs) {
    auto it = std::find(peers.begin(), peers.end(), m.peer);
    size_t p = size_t(it - peers.begin());
    if (it == peers.end()) {
      peers.push_back(m.peer);
      byPeer.emplace_back();
    }
    size_t off = 0;
    do {
      RelayChunk c;
      c.peer = m.peer;
      c.user = m.data + off;
      c.n = std::min(chunk, m.bytes - off);
      byPeer[p].push_back(c);
      off += c.n;
    } while (off < m.bytes);
  }
  std::vector<RelayChunk> out;
  size_t total = 0;
  for (auto& v : byPeer) total += v.size();
  out.reserve(total);
  for (size_t i = 0; out.size() < total; ++i)
    for (auto& v : byPeer)
      if (i < v.size()) out.push_back(v[i]);
  return out;
}

RelayPipeline::RelayPipeline(const RelayRequest& req, RelayState& state, StagedPath* path)
    : state_(state), path_(path), polled_(req.stage == RelayStage::kCuda), chunk_(req.chunk_bytes), slots_(req.slots) {
  out_ = cutIntoChunks(req.sends, chunk_);
  in_ = cutIntoChunks(req.recvs, chunk_);
  auto& pc = state_.peers();
  for (const RelayChunk& c : out_) RelayPeerCounters::bump(pc[size_t(c.peer)].send_chunks);
  for (const RelayChunk& c : in_) RelayPeerCounters::bump(pc[size_t(c.peer)].recv_chunks);
  if (path_) {
    if (!out_.empty()) sendSlots_ = path_->send_slots.ensure(*path_->in, slots_ * chunk_);
    if (!in_.empty()) recvSlots_ = path_->recv_slots.ensure(*path_->out, slots_ * chunk_);
    for (size_t s = slots_; s-- > 0;) {
      freeSend_.push_back(int(s));
      freeRecv_.push_back(int(s));
    }
  }
  sendWin_.reserve(slots_);
  sendWinChunk_.reserve(slots_);
  recvWin_.reserve(slots_);
  recvWinChunk_.reserve(slots_);
  copyingOut_.reserve(slots_);
}

bool RelayPipeline::retireSends() {
  bool moved = false;
  size_t k = 0;
  for (size_t i = 0; i < sendWin_.size(); ++i) {
    if (!sendWin_[i].done) {
      sendWin_[k] = sendWin_[i];
      sendWinChunk_[k++] = sendWinChunk_[i];
      continue;
    }
    const RelayChunk& c = out_[sendWinChunk_[i]];
    RelayPeerCounters::bump(state_.peers()[size_t(c.peer)].sent);
    if (path_) freeSend_.push_back(c.slot);
    ++sentCount_;
    moved = true;
  }
  sendWin_.resize(k);
  sendWinChunk_.resize(k);
  return moved;
}

bool RelayPipeline::retireRecvs() {
  bool moved = false;
  size_t k = 0;
  for (size_t i = 0; i < recvWin_.size(); ++i) {
    if (!recvWin_[i].done) {
      recvWin_[k] = recvWin_[i];
      recvWinChunk_[k++] = recvWinChunk_[i];
      continue;
    }
    size_t idx = recvWinChunk_[i];
    RelayChunk& c = in_[idx];
    RelayPeerCounters::bump(state_.peers()[size_t(c.peer)].received);
    if (path_) {
      c.ticket = path_->out->post(c.user, recvSlots_ + size_t(c.slot) * chunk_, c.n);
      copyingOut_.push_back(idx);
    } else {
      ++outDone_;
    }
    moved = true;
  }
  recvWin_.resize(k);
  recvWinChunk_.resize(k);
  if (path_ && !copyingOut_.empty()) {
    uint64_t done = path_->out->completed();
    size_t n = 0;
    while (n < copyingOut_.size() && in_[copyingOut_[n]].ticket <= done) {
      const RelayChunk& c = in_[copyingOut_[n++]];
      freeRecv_.push_back(c.slot);
      RelayPeerCounters::bump(state_.peers()[size_t(c.peer)].copied_out);
      ++outDone_;
    }
    if (n) {
      copyingOut_.erase(copyingOut_.begin(), copyingOut_.begin() + long(n));
      moved = true;
    }
  }
  return moved;
}

bool RelayPipeline::admitSends() {
  bool moved = false;
  auto toWire = [&](size_t idx, const uint8_t* data) {
    SendItem s{};
    s.peer = out_[idx].peer;
    s.data = data;
    s.len = out_[idx].n;
    sendWin_.push_back(s);
    sendWinChunk_.push_back(idx);
    moved = true;
  };
  if (!path_) {
    while (nextWire_ < out_.size() && sendWin_.size() < slots_) {
      toWire(nextWire_, out_[nextWire_].user);
      ++nextWire_;
    }
    return moved;
  }
  while (nextCopy_ < out_.size() && !freeSend_.empty()) {
    RelayChunk& c = out_[nextCopy_++];
    c.slot = freeSend_.back();
    freeSend_.pop_back();
    c.ticket = path_->in->post(sendSlots_ + size_t(c.slot) * chunk_, c.user, c.n);
    moved = true;
  }
  if (nextWire_ < nextCopy_) {
    uint64_t done = path_->in->completed();
    while (nextWire_ < nextCopy_ && out_[nextWire_].ticket <= done) {
      const RelayChunk& c = out_[nextWire_];
      RelayPeerCounters::bump(state_.peers()[size_t(c.peer)].copied_in);
      toWire(nextWire_++, sendSlots_ + size_t(c.slot) * chunk_);
    }
  }
  return moved;
}

bool RelayPipeline::admitRecvs() {
  bool moved = false;
  while (nextPost_ < in_.size() && (path_ ? !freeRecv_.empty() : recvWin_.size() < slots_)) {
    RelayChunk& c = in_[nextPost_];
    RecvItem r{};
    r.peer = c.peer;
    r.len = c.n;
    if (path_) {
      c.slot = freeRecv_.back();
      freeRecv_.pop_back();
      r.dst = recvSlots_ + size_t(c.slot) * chunk_;
    } else {
      r.dst = c.user;
    }
    recvWin_.push_back(r);
    recvWinChunk_.push_back(nextPost_++);
    moved = true;
  }
  return moved;
}

bool RelayPipeline::pump() {
  bool moved = retireSends();
  moved |= retireRecvs();
  moved |= admitSends();
  moved |= admitRecvs();
  int64_t now = monoNs();
  bool on = !sendWin_.empty() || !recvWin_.empty();
  if (on && !wireOn_) {
    wireOn_ = true;
    wireFrom_ = now;
  } else if (!on && wireOn_) {
    wireOn_ = false;
    wireNs_ += now - wireFrom_;
  }
  return moved;
}

bool RelayPipeline::finished() const { return sentCount_ == out_.size() && outDone_ == in_.size(); }

SendItem* RelayPipeline::sends(size_t* n) {
  *n = sendWin_.size();
  return sendWin_.data();
}

RecvItem* RelayPipeline::recvs(size_t* n) {
  *n = recvWin_.size();
  return recvWin_.data();
}

bool RelayPipeline::copying() const { return path_ && (nextWire_ < nextCopy_ || !copyingOut_.empty()); }

uint32_t RelayPipeline::copySeq() const {
  return const_cast<RelayState&>(state_).bell().seq.load(std::memory_order_acquire);
}

void RelayPipeline::waitCopies(uint32_t seen, int64_t timeoutNs) {
  if (!path_) return;
  // A CUDA copy completes as an event, with no wake-up to sleep on: poll, giving the core away.
  if (polled_) {
    sched_yield();
    return;
  }
  state_.bell().wait(seen, std::min<int64_t>(timeoutNs, 1000000));  // host lanes ring it after every copy
}

}  // namespace hetobs
