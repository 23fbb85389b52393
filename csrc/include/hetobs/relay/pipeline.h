#pragma once
// The pipelined relay: every message cut into chunks; chunk i+1 is copied into a send
// slot while chunk i is on the wire and chunk i-1 is copied out of its receive slot.
// A chunk holds its slot from its copy-in until the wire has taken it (send side), or
// from being posted to the wire until its copy-out is done (receive side), so at most
// `slots` chunks are in flight each way. Stage kNone: no copies; chunks go from and to
// the caller's buffers, at most `slots` on the wire each way.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hetobs/comm/exchange_feed.h"
#include "hetobs/relay/relay_state.h"

namespace hetobs {

struct RelayChunk {
  int peer = -1;
  uint8_t* user = nullptr;  // source (send) or destination (recv) in the caller's buffer
  size_t n = 0;
  int slot = -1;
  uint64_t ticket = 0;  // its copy on the lane
};

// Messages cut into chunks of `chunk` bytes (a message of 0 bytes is one empty chunk),
// peers interleaved chunk by chunk so every link moves from the start.
std::vector<RelayChunk> cutIntoChunks(const std::vector<RelayMessage>& msgs, size_t chunk);

class RelayPipeline final : public ExchangeFeed {
 public:
  // `path` is null for kNone. Counters of every peer must be reset and sized before.
  RelayPipeline(const RelayRequest& req, RelayState& state, StagedPath* path);

  bool pump() override;
  bool finished() const override;
  SendItem* sends(size_t* n) override;
  RecvItem* recvs(size_t* n) override;
  bool copying() const override;
  uint32_t copySeq() const override;
  void waitCopies(uint32_t seen, int64_t timeoutNs) override;

  int64_t wireNs() const { return wireNs_; }

 private:
  bool admitSends();
  bool admitRecvs();
  bool retireSends();
  bool retireRecvs();

  RelayState& state_;
  StagedPath* path_;
  bool polled_;  // copy completion is polled (CUDA events), not rung
  size_t chunk_, slots_;
  uint8_t* sendSlots_ = nullptr;
  uint8_t* recvSlots_ = nullptr;
  std::vector<RelayChunk> out_, in_;
  std::vector<int> freeSend_, freeRecv_;
  size_t nextCopy_ = 0;   // out_: next chunk to copy in
  size_t nextWire_ = 0;   // out_: next chunk to put on the wire (its copy done)
  size_t sentCount_ = 0;
  size_t nextPost_ = 0;   // in_: next chunk to post a receive for
  size_t outDone_ = 0;    // in_ chunks copied out
  std::vector<SendItem> sendWin_;
  std::vector<size_t> sendWinChunk_;
  std::vector<RecvItem> recvWin_;
  std::vector<size_t> recvWinChunk_;
  std::vector<size_t> copyingOut_;  // in_ chunks whose copy-out is posted, in ticket order
  bool wireOn_ = false;
  int64_t wireFrom_ = 0, wireNs_ = 0;
};

}  // namespace hetobs
