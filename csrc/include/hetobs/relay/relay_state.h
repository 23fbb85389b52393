#pragma once
// What a communicator keeps for its relay ops: a copy lane per direction and staging
// buffers for each staged kind (host, cuda, device), made on first use and reused by every
// relay after (no allocation per chunk or per op once sizes are steady), and the
// per-peer stage counters that dumps show.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "hetobs/common/futex.h"
#include "hetobs/relay/copy_lane.h"
#include "hetobs/relay/relay.h"

namespace hetobs {

// A buffer that only grows (freed and made again only when a larger one is asked for).
class StagingBuffer {
 public:
  ~StagingBuffer() { release(); }
  uint8_t* ensure(CopyLane& lane, size_t bytes);
  void release();

 private:
  CopyLane* lane_ = nullptr;
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

struct StagedPath {
  std::unique_ptr<CopyLane> in, out;  // copy-in (d2h) and copy-out (h2d)
  StagingBuffer send_slots, recv_slots;  // pipelined: slots x chunk bytes each way
  StagingBuffer send_bulk, recv_bulk;    // unpipelined: whole messages
  ~StagedPath() {  // buffers go back to their lane before the lane goes
    send_slots.release(), recv_slots.release(), send_bulk.release(), recv_bulk.release();
  }
};

// After a failed relay: wait for both directions' copies, each on its own, so no copy
// touches the caller's buffers after the op returned even when one lane fails to drain.
void drainAfterFailure(StagedPath& path);

class RelayState {
 public:
  // `wake` runs on a copy thread after each copy (rings the op thread's doorbell too).
  RelayState(int commSize, std::function<void()> wake);
  ~RelayState();

  // The copy lanes and staging of the request's stage (kHost, kCuda or kDevice) and
  // device, made on first use (a relay on another device than the last one's makes new ones).
  StagedPath& path(const RelayRequest& r);
  std::vector<RelayPeerCounters>& peers() { return peers_; }
  const std::vector<RelayPeerCounters>& peers() const { return peers_; }
  Doorbell& bell() { return bell_; }  // rung after every host copy

  // The running relay, as dumps describe it.
  std::atomic<uint8_t> stage{0};
  std::atomic<bool> pipeline{true};
  std::atomic<uint64_t> chunk_bytes{0}, slots{0};
  // kDevice: torch's device type code and index of the running relay's buffers (dumps name them).
  std::atomic<int> device_type{-1}, device_index{-1};

 private:
  std::function<void()> wake_;
  std::vector<RelayPeerCounters> peers_;
  Doorbell bell_;
  std::unique_ptr<StagedPath> host_, device_;
  RelayStage deviceStage_ = RelayStage::kNone;
  int deviceType_ = -1, deviceIndex_ = -1;
};

}  // namespace hetobs
