#include "hetobs/common/wire.h"

#include "hetobs/common/error.h"

namespace hetobs {

size_t dtypeSize(DType t) {
  static const size_t kSizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
  return uint8_t(t) < uint8_t(DType::kCount) ? kSizes[uint8_t(t)] : 0;
}

const char* dtypeName(DType t) {
  static const char* kNames[] = {"int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
  return uint8_t(t) < uint8_t(DType::kCount) ? kNames[uint8_t(t)] : "invalid";
}

const char* opName(OpKind op) {
  static const char* kNames[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
                                 "barrier",    "send",           "recv",       "gather",    "scatter",
                                 "relay"};
  return uint8_t(op) < uint8_t(OpKind::kCount) ? kNames[uint8_t(op)] : "invalid";
}

const char* redOpName(RedOp op) {
  static const char* kNames[] = {"sum", "prod", "min", "max", "avg", "other"};
  return uint8_t(op) < uint8_t(RedOp::kCount) ? kNames[uint8_t(op)] : "invalid";
}

bool isP2P(OpKind op) { return op == OpKind::kSend || op == OpKind::kRecv || op == OpKind::kRelay; }

std::string OpDesc::str() const {
  std::string s = strFormat("%s seq %llu count %llu %s", opName(op), (unsigned long long)seq,
                            (unsigned long long)count, dtypeName(dtype));
  if (op == OpKind::kAllReduce || op == OpKind::kReduce || op == OpKind::kReduceScatter)
    s += std::string(" ") + redOpName(redop);
  if (op == OpKind::kBroadcast || op == OpKind::kReduce) s += strFormat(" root %d", root);
  return s;
}

OpDesc FrameHeader::desc() const {
  OpDesc d;
  d.comm_tag = comm_tag;
  d.op = OpKind(op);
  d.dtype = DType(dtype);
  d.redop = RedOp(redop);
  d.root = root;
  d.seq = seq;
  d.count = count;
  return d;
}

void FrameHeader::setDesc(const OpDesc& d) {
  comm_tag = d.comm_tag;
  op = uint8_t(d.op);
  dtype = uint8_t(d.dtype);
  redop = uint8_t(d.redop);
  root = d.root;
  seq = d.seq;
  count = d.count;
}

}  // namespace hetobs
