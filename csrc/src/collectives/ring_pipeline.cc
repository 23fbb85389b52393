#include "hetobs/collectives/ring_pipeline.h"

#include <poll.h>

#include <algorithm>

#include "hetobs/collectives/reduce_kernels.h"
#include "hetobs/common/clock.h"
#include "hetobs/transport/tcp/channel.h"

namespace hetobs {
namespace {

// One frame per segment: the finest grain the link numbers and resumes by.
constexpr size_t kRingSegmentBytes = tcp::kTcpFrameBytes;
// Segments admitted ahead per direction: the next is ready the moment one completes.
constexpr size_t kWindow = 8;

}  // namespace

RingPipeline::RingPipeline(Communicator& c, const OpArgs& a)
    : c_(c), a_(a), n_(c.size()), right_(mod(c.rank() + 1, c.size())), left_(mod(c.rank() - 1, c.size())) {
  const int r = c.rank();
  const size_t es = dtypeSize(a.dtype);
  // Every block gets the same number of segments (element-exact splits, at most
  // kRingSegmentBytes each), so segment j of a block means the same bytes at every step.
  const size_t maxBlock = blockOf(a.send_count, n_, 0).count * es;
  segs_ = std::max<size_t>(1, (maxBlock + kRingSegmentBytes - 1) / kRingSegmentBytes);
  const size_t steps = size_t(2 * (n_ - 1));
  total_ = steps * segs_;
  send_.assign(total_, SendItem{});
  recv_.assign(total_, RecvItem{});
  for (size_t k = 0; k < steps; ++k) {
    bool rs = k < size_t(n_ - 1);  // reduce-scatter, then all-gather
    int kk = rs ? int(k) : int(k) - (n_ - 1);
    Block sb = blockOf(a.send_count, n_, rs ? mod(r - kk - 1, n_) : mod(r - kk, n_));
    Block tb = blockOf(a.send_count, n_, rs ? mod(r - kk - 2, n_) : mod(r - kk - 1, n_));
    for (size_t j = 0; j < segs_; ++j) {
      Block ss = blockOf(sb.count, int(segs_), int(j)), ts = blockOf(tb.count, int(segs_), int(j));
      SendItem& s = send_[k * segs_ + j];
      s.peer = right_;
      s.data = a.recv + (sb.offset + ss.offset) * es;
      s.len = ss.count * es;
      s.keep = true;
      RecvItem& v = recv_[k * segs_ + j];
      v.peer = left_;
      v.dst = a.recv + (tb.offset + ts.offset) * es;
      v.len = ts.count * es;
      if (rs) {
        v.local = v.dst;
        v.mode = RecvMode::kReduce;
        v.dtype = a.dtype;
        v.redop = a.redop;
      }
    }
  }
  send_.back().keep = false;  // its ack confirms every segment before the op returns
}

bool RingPipeline::pump() {
  const size_t es = dtypeSize(a_.dtype);
  const size_t lastRs = size_t(n_ - 2) * segs_;  // first segment of the last reduce-scatter step
  const size_t agFirst = size_t(n_ - 1) * segs_;
  bool changed = false;
  while (sHead_ < sNext_ && send_[sHead_].done) ++sHead_, changed = true;
  while (rHead_ < rNext_ && recv_[rHead_].done) {
    // This rank's own block is complete once the last reduce-scatter step delivered it.
    if (a_.redop == RedOp::kAvg && rHead_ >= lastRs && rHead_ < agFirst)
      divideBy(a_.dtype, recv_[rHead_].dst, recv_[rHead_].len / es, double(n_));
    ++rHead_;
    changed = true;
  }
  // A segment is forwarded once the step before delivered (and reduced) the same bytes.
  while (sNext_ < total_ && sNext_ - sHead_ < kWindow && (sNext_ < segs_ || sNext_ - segs_ < rHead_))
    ++sNext_, changed = true;
  Channel* out = c_.channel(right_);
  while (rNext_ < total_ && rNext_ - rHead_ < kWindow) {
    if (rNext_ >= agFirst) {
      const SendItem& sent = send_[rNext_ - agFirst];  // the reduce-scatter segment these bytes replace
      if (!sent.done) break;
      if (!out->sendConfirmed(sent)) {
        out->pollControl();  // reads the acks waiting on the link
        if (!out->sendConfirmed(sent)) break;
      }
    }
    ++rNext_;
    changed = true;
  }
  return changed;
}

SendItem* RingPipeline::sends(size_t* n) {
  *n = sNext_ - sHead_;
  return send_.data() + sHead_;
}

RecvItem* RingPipeline::recvs(size_t* n) {
  *n = rNext_ - rHead_;
  return recv_.data() + rHead_;
}

void RingPipeline::waitCopies(uint32_t, int64_t timeoutNs) {
  pollfd fds[2] = {{c_.channel(right_)->pollFd(), POLLIN, 0}, {c_.channel(left_)->pollFd(), POLLIN, 0}};
  timespec ts{time_t(timeoutNs / 1000000000LL), long(timeoutNs % 1000000000LL)};
  ppoll(fds, right_ == left_ ? 1 : 2, &ts, nullptr);
}

bool ringPipelined(const Communicator& c) {
  if (c.size() < 2) return false;
  const Channel* r = c.channel(mod(c.rank() + 1, c.size()));
  const Channel* l = c.channel(mod(c.rank() - 1, c.size()));
  return r && l && !r->isShm() && !l->isShm();
}

void ringPipelinedAllReduce(Communicator& c, const OpArgs& a) {
  RingPipeline p(c, a);
  int64_t t0 = monoNs();
  c.exchangeFed(p);
  // Busy time per link, as exchange() counts it (network bandwidth = bytes / busy time).
  int64_t took = monoNs() - t0;
  for (int peer : {mod(c.rank() + 1, c.size()), mod(c.rank() - 1, c.size())}) {
    auto& k = c.channel(peer)->counters();
    k.busy_ns.store(k.busy_ns.load(std::memory_order_relaxed) + took, std::memory_order_relaxed);
  }
}

}  // namespace hetobs
