#pragma once
// all_reduce's ring over TCP, pipelined at chunk granularity: the 2(n-1) ring steps are cut
// into segments (one TCP frame each), and segment j of step k+1 goes out as soon as segment
// j of step k has arrived and been reduced, not when the whole step is done. Several
// segments are in flight per link: sends are SendItem::keep (complete once written; the
// channel holds them until acknowledged, for a resume), except the op's last one, whose ack
// confirms all. The only hazard of not waiting for acks, the all-gather overwriting a block
// reduce-scatter sent, is ordered explicitly: segment j of all-gather step k is received
// only once segment j of reduce-scatter step k (the same bytes) is confirmed.
#include <vector>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/comm/exchange_feed.h"

namespace hetobs {

class RingPipeline final : public ExchangeFeed {
 public:
  RingPipeline(Communicator& c, const OpArgs& a);
  bool pump() override;
  bool finished() const override { return sHead_ == total_ && rHead_ == total_; }
  SendItem* sends(size_t* n) override;
  RecvItem* recvs(size_t* n) override;
  bool copying() const override { return false; }
  uint32_t copySeq() const override { return 0; }
  // Nothing admitted on either side (waiting for an ack): sleep until a link has input.
  void waitCopies(uint32_t seen, int64_t timeoutNs) override;

 private:
  Communicator& c_;
  const OpArgs& a_;
  int n_, right_, left_;
  size_t segs_ = 1, total_ = 0;
  std::vector<SendItem> send_;  // step k, segment j at k * segs_ + j
  std::vector<RecvItem> recv_;
  size_t sHead_ = 0, sNext_ = 0, rHead_ = 0, rNext_ = 0;  // retired below head, admitted below next
};

// Whether all_reduce's ring runs pipelined here (both ring neighbours are TCP links).
bool ringPipelined(const Communicator& c);
void ringPipelinedAllReduce(Communicator& c, const OpArgs& a);

}  // namespace hetobs
