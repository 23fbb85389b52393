#pragma once
// Vocabulary shared by the wire protocol, the recorder and Python (hetobs/comm.py,
// hetobs/buffers.py hold the same codes). Values are part of the dump format: never
// renumber, only append.
#include <cstddef>
#include <cstdint>
#include <string>

namespace hetobs {

enum class DType : uint8_t { kInt8 = 0, kUint8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64, kCount };
// kRelay: many messages to and from peers in one op (hetobs/relay/relay.h); p2p-style.
// kGather and kScatter are recorded for vendor libraries (MPI, torch); the native
// transport does not implement them. RedOp::kOther stands for a vendor reduction hetobs
// cannot name (MPI_LAND, user ops, ...).
enum class OpKind : uint8_t {
  kAllReduce = 0, kReduceScatter, kAllGather, kBroadcast, kReduce, kAllToAll, kBarrier, kSend, kRecv,
  kGather, kScatter, kRelay, kCount
};
enum class RedOp : uint8_t { kSum = 0, kProd, kMin, kMax, kAvg, kOther, kCount };

size_t dtypeSize(DType t);
const char* dtypeName(DType t);
const char* opName(OpKind op);
const char* redOpName(RedOp op);
bool isP2P(OpKind op);

// What every rank of one op must agree on; carried in every data frame and compared
// with the receiver's own op, so disagreement is an error, never corrupted memory.
struct OpDesc {
  uint32_t comm_tag = 0;  // low 32 bits of the communicator id
  OpKind op = OpKind::kAllReduce;
  DType dtype = DType::kFloat32;
  RedOp redop = RedOp::kSum;
  int32_t root = 0;       // root for rooted ops; unused (0) otherwise
  uint64_t seq = 0;       // collective seq id, or per-peer p2p seq for send/recv
  uint64_t count = 0;     // element count of the op as the caller saw it (send side for p2p)

  bool operator==(const OpDesc& o) const {
    return comm_tag == o.comm_tag && op == o.op && dtype == o.dtype && redop == o.redop && root == o.root &&
           seq == o.seq && count == o.count;
  }
  bool operator!=(const OpDesc& o) const { return !(*this == o); }
  std::string str() const;  // "all_reduce seq 17 count 2048 float32 sum"
};

// kClose: the sender closes the link on purpose (its communicator closed): the only deliberate close. A
// bare end of stream or a reset is a broken connection, re-made where reconnect is on (a reset
// read by a send leaves the next receive an end of stream, so neither can mean "closed").
enum class FrameKind : uint8_t { kData = 1, kAck = 2, kAbort = 3, kClose = 4 };

// 64-byte frame header on every transport. Chunks are numbered per direction of a
// link (monotonic over the link's life) and acknowledged cumulatively, so a later
// reconnect can resume from the last acknowledged chunk.
struct FrameHeader {
  uint32_t magic;          // kFrameMagic
  uint8_t kind;            // FrameKind
  uint8_t op;              // OpDesc fields follow (flattened for a fixed layout)
  uint8_t dtype;
  uint8_t redop;
  uint32_t comm_tag;
  int32_t root;
  uint64_t seq;
  uint64_t count;
  uint64_t chunk;          // kData: this chunk's number; kAck: chunks received so far
  uint64_t bytes;          // payload bytes following the header (kAbort: message text)
  // kData: the latest entry into this op the sender knows of (record/arrival.h: who arrives
  // last, carried by every data frame, so it costs no message of its own); 0: none.
  uint64_t arrival;
  // The transport's own word: shared memory carries a mail frame's payload (up to 8 bytes)
  // or a single-copy frame's buffer address and mark here (transport/shm/single_copy.h).
  uint64_t aux;

  OpDesc desc() const;
  void setDesc(const OpDesc& d);
};
static_assert(sizeof(FrameHeader) == 64, "frame header is 64 bytes on the wire");
constexpr uint32_t kFrameMagic = 0x31425448;  // "HTB1"

}  // namespace hetobs
