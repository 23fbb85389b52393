#pragma once
// The relay op: a pure transfer of many messages to and from peers in one op, through
// host staging when the buffers live on a device (the cross-island path of a
// heterogeneous job). See docs/islands.md, "Pipelined host relay".
//
// Sequence ids: a relay is p2p-style (isP2P(kRelay)): only the ranks that call it take
// part. Its frames carry a per-pair relay count (both ends of a link count the relays
// they share), its record a p2p_seq like send/recv.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hetobs/common/error.h"

namespace hetobs {

// Where the caller's buffers live, which decides what the staging copies are.
enum class RelayStage : uint8_t {
  kNone = 0,  // host memory on the wire directly (no copies)
  kHost = 1,  // host memory, copied through host staging slots by copy threads (measures the pipeline)
  kCuda = 2,  // device pointers: cudaMemcpyAsync into pinned staging on a copy stream per direction
  // Device pointers of any torch device type (npu, xpu, a PrivateUse1 device, cuda too):
  // copies through torch's device-generic API on a stream of the relay's own, into the
  // device's pinned staging (relay/device_lane_hooks.h; hetobs._torch_ext provides it).
  kDevice = 3,
};
const char* relayStageName(RelayStage s);

struct RelayMessage {
  int peer = -1;
  uint8_t* data = nullptr;  // host address, or device address for kCuda
  size_t bytes = 0;
};

// What the relay measured (phases of the op as this rank saw it).
struct RelayPhases {
  int64_t d2h_ns = 0;   // copy-in stage busy (source -> send staging)
  int64_t wire_ns = 0;  // some chunk was on the wire
  int64_t h2d_ns = 0;   // copy-out stage busy (receive staging -> destination)
  int64_t wall_ns = 0;
  uint64_t chunks = 0;  // wire chunks sent plus received
  uint64_t bytes_sent = 0, bytes_recv = 0;
};

// One relay call: its arguments and, once it finished, its phases.
struct RelayRequest {
  std::vector<RelayMessage> sends, recvs;  // several per peer allowed, in order
  RelayStage stage = RelayStage::kNone;
  bool pipeline = true;
  size_t chunk_bytes = 4 << 20;
  size_t slots = 16;
  int device = -1;  // kCuda, kDevice: the device index the buffers live on
  void* cuda_stream = nullptr;  // kCuda: the caller's stream; the relay's copies start after its work
  int device_type = -1;         // kDevice: torch's DeviceType code (c10::DeviceType)
  int64_t device_stream = 0;    // kDevice: the caller's stream id (c10::StreamId), waited for on the device
  bool order_after_stream = false;  // kDevice: whether device_stream is set
  RelayPhases phases;
};

// Chunks of one peer's messages at each stage, for dumps (so a diagnosis can tell data
// that stopped in the device copy from data that stopped on the wire). Written by the op
// thread with relaxed stores, read by anyone.
struct RelayPeerCounters {
  std::atomic<uint64_t> send_chunks{0}, copied_in{0}, sent{0};
  std::atomic<uint64_t> recv_chunks{0}, received{0}, copied_out{0};
  void reset() {
    for (auto* a : {&send_chunks, &copied_in, &sent, &recv_chunks, &received, &copied_out})
      a->store(0, std::memory_order_relaxed);
  }
  static void bump(std::atomic<uint64_t>& a) { a.store(a.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
};

// The two ends of a link disagree on what crosses it (message count or sizes, chunking).
class RelayMismatch : public MismatchError {
 public:
  using MismatchError::MismatchError;
};

}  // namespace hetobs
