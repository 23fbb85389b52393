#include "instrumented_backend.h"

#include <cstring>
#include <optional>

#include "completion_poller.h"
#include "instrumented_work.h"

namespace hetobs::torch_ext {
namespace {

DType dtypeOf(at::ScalarType t) {
  switch (t) {
    case at::kChar: return DType::kInt8;
    case at::kByte: return DType::kUint8;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    default: return DType::kFloat32;  // as the Python wrapper: bytes stay exact, the name is float32
  }
}

RedOp redopOf(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return RedOp::kSum;
    case c10d::ReduceOp::PRODUCT: return RedOp::kProd;
    case c10d::ReduceOp::MIN: return RedOp::kMin;
    case c10d::ReduceOp::MAX: return RedOp::kMax;
    case c10d::ReduceOp::AVG: return RedOp::kAvg;
    default: return RedOp::kOther;  // PREMUL_SUM, BAND, ...: hetobs records "other"
  }
}

uint64_t numel(const std::vector<at::Tensor>& ts) {
  uint64_t n = 0;
  for (const auto& t : ts) n += uint64_t(t.numel());
  return n;
}

uint64_t numel(const std::vector<std::vector<at::Tensor>>& tss) {
  uint64_t n = 0;
  for (const auto& ts : tss) n += numel(ts);
  return n;
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& tss) {
  std::vector<at::Tensor> out;
  for (const auto& ts : tss) out.insert(out.end(), ts.begin(), ts.end());
  return out;
}

// Every rank's `bytes` into `all` through the vendor backend's own all_gather: the digest
// exchange of a wrapped library (ExternalHooks::check_result's `gather`).
int vendorGather(void* ctx, const uint8_t* mine, uint64_t bytes, uint8_t* all) {
  auto& vendor = *static_cast<c10d::Backend*>(ctx);
  try {
    std::vector<at::Tensor> in{at::empty({int64_t(bytes)}, at::kByte)};
    memcpy(in[0].data_ptr(), mine, bytes);
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < vendor.getSize(); ++r) out[0].push_back(at::empty({int64_t(bytes)}, at::kByte));
    vendor.allgather(out, in)->wait();
    for (int r = 0; r < vendor.getSize(); ++r) memcpy(all + size_t(r) * bytes, out[0][size_t(r)].data_ptr(), bytes);
    return 0;
  } catch (const std::exception&) {  // the core reports it (register_comm.cpp): no exception crosses the C table
    return 1;
  }
}

}  // namespace

struct InstrumentedBackend::Shape {
  const at::Tensor* first = nullptr;  // dtype and device of the op
  uint64_t count = 0, outCount = 0, bytes = 0;

  void add(const at::Tensor& t) {
    if (!first) first = &t;
    count += uint64_t(t.numel());
    bytes += uint64_t(t.numel()) * uint64_t(t.element_size());
  }
  // The input tensor(s) and what this rank receives (default: as many elements as it gives).
  static Shape of(const std::vector<at::Tensor>& in, std::optional<uint64_t> out = std::nullopt) {
    Shape s;
    for (const auto& t : in) s.add(t);
    s.outCount = out ? *out : s.count;
    return s;
  }
  static Shape of(const at::Tensor& in, uint64_t out) {
    Shape s;
    s.add(in);
    s.outCount = out;
    return s;
  }
  static Shape of(const std::vector<std::vector<at::Tensor>>& in, uint64_t out) {
    Shape s;
    for (const auto& ts : in)
      for (const auto& t : ts) s.add(t);
    s.outCount = out;
    return s;
  }
};

InstrumentedBackend::InstrumentedBackend(c10::intrusive_ptr<c10d::Backend> inner, const ExternalHandle& external,
                                         std::string name, bool deviceOps)
    : c10d::Backend(inner->getRank(), inner->getSize()),
      inner_(std::move(inner)),
      external_(external),
      name_(std::move(name)),
      deviceOps_(deviceOps) {}

template <typename Call, typename Result>
c10::intrusive_ptr<c10d::Work> InstrumentedBackend::run(OpKind op, const Shape& shape, RedOp redop, int rootOrPeer,
                                                        Call&& call, Result&& result) {
  ExternalOp rec;
  rec.op = op;
  rec.dtype = shape.first ? dtypeOf(shape.first->scalar_type()) : DType::kFloat32;
  rec.redop = redop;
  rec.root_or_peer = rootOrPeer;
  rec.count = shape.count;
  rec.out_count = shape.outCount;
  rec.bytes = shape.bytes;
  bool onDevice = deviceOps_ || (shape.first && !shape.first->is_cpu());
  uint64_t token = external_.begin(rec);
  c10::intrusive_ptr<c10d::Work> inner;
  try {
    inner = call();
  } catch (const std::exception& e) {
    external_.end(token, false, e.what());
    throw;
  }
  if (!inner) {  // a backend that completed the op synchronously
    external_.end(token, true);
    return inner;
  }
  if constexpr (!std::is_same_v<std::decay_t<Result>, std::nullptr_t>) {
    if (__builtin_expect(external_.digestDue(token), 0)) checkResult(token, *inner, result());
  }
  auto work = c10::make_intrusive<InstrumentedWork>(std::move(inner),
                                                    c10::intrusive_ptr<InstrumentedBackend>::reclaim_copy(this), token);
  if (onDevice) {
    // False when every slot is taken: the op then ends at wait() or release of its Work.
    CompletionPoller::instance().watch(work);
  } else if (!noFuture_[size_t(op)].load(std::memory_order_relaxed) && !work->finishFromFuture()) {
    // Learned once per op kind: asking again would throw (and unwind) on every call.
    noFuture_[size_t(op)].store(true, std::memory_order_relaxed);
  }
  return work;
}

void InstrumentedBackend::checkResult(uint64_t token, c10d::Work& inner, const std::vector<at::Tensor>& result) {
  if (result.empty()) return;
  for (const auto& t : result)  // the digest reads host memory: device results are not checked (docs/digests.md)
    if (!t.is_cpu() || t.layout() != at::kStrided || t.scalar_type() != result[0].scalar_type()) return;
  try {
    inner.wait();  // the check needs the result: a sampled op completes here, before the caller sees it
  } catch (const std::exception& e) {
    external_.end(token, false, e.what());
    throw;
  }
  // One contiguous run of elements: the tensor itself, or a copy of a list (the test hook's
  // flip then lands in the copy, which is what is compared).
  at::Tensor flat = result.size() == 1 && result[0].is_contiguous() ? result[0] : [&] {
    std::vector<at::Tensor> parts;
    for (const auto& t : result) parts.push_back(t.contiguous().view(-1));
    return at::cat(parts);
  }();
  std::string msg;
  int rc = external_.checkResult(token, static_cast<uint8_t*>(flat.data_ptr()), uint64_t(flat.numel()),
                                 uint32_t(flat.element_size()), vendorGather, &vendor(), &msg);
  if (rc == 2) {  // ExternalComm::kDigestRaise: the job is told rather than training on
    external_.end(token, false, msg.c_str());
    C10_THROW_ERROR(DistBackendError, msg);
  }
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  return run(OpKind::kBroadcast, Shape::of(tensors), RedOp::kSum, int(opts.rootRank),
             [&] { return vendor().broadcast(tensors, opts); }, [&] { return tensors; });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  return run(OpKind::kAllReduce, Shape::of(tensors), redopOf(opts.reduceOp), -1,
             [&] { return vendor().allreduce(tensors, opts); }, [&] { return tensors; });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceOptions& opts) {
  return run(OpKind::kAllReduce, Shape::of(tensors), redopOf(opts.reduceOp), -1,
             [&] { return vendor().allreduce_sparse(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                        const c10d::AllreduceCoalescedOptions& opts) {
  return run(OpKind::kAllReduce, Shape::of(tensors), redopOf(opts.reduceOp), -1,
             [&] { return vendor().allreduce_coalesced(tensors, opts); }, [&] { return tensors; });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  return run(OpKind::kReduce, Shape::of(tensors), redopOf(opts.reduceOp), int(opts.rootRank),
             [&] { return vendor().reduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllgatherOptions& opts) {
  return run(OpKind::kAllGather, Shape::of(inputs, numel(outputs)), RedOp::kSum, -1,
             [&] { return vendor().allgather(outputs, inputs, opts); }, [&] { return flatten(outputs); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::AllgatherOptions& opts) {
  return run(OpKind::kAllGather, Shape::of(input, uint64_t(output.numel())), RedOp::kSum, -1,
             [&] { return vendor()._allgather_base(output, input, opts); },
             [&] { return std::vector<at::Tensor>{output}; });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                        std::vector<at::Tensor>& inputs,
                                                                        const c10d::AllgatherOptions& opts) {
  return run(OpKind::kAllGather, Shape::of(inputs, numel(outputs)), RedOp::kSum, -1,
             [&] { return vendor().allgather_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  return run(OpKind::kAllGather, Shape::of(inputs, numel(outputs)), RedOp::kSum, -1,
             [&] { return vendor().allgather_into_tensor_coalesced(outputs, inputs, opts); },
             [&] { return outputs; });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::GatherOptions& opts) {
  return run(OpKind::kGather, Shape::of(inputs, numel(outputs)), RedOp::kSum, int(opts.rootRank),
             [&] { return vendor().gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ScatterOptions& opts) {
  // As the Python wrapper: the record's count is what this rank receives.
  return run(OpKind::kScatter, Shape::of(outputs), RedOp::kSum, int(opts.rootRank),
             [&] { return vendor().scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                                   const c10d::ReduceScatterOptions& opts) {
  return run(OpKind::kReduceScatter, Shape::of(inputs, numel(outputs)), redopOf(opts.reduceOp), -1,
             [&] { return vendor().reduce_scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
  return run(OpKind::kReduceScatter, Shape::of(input, uint64_t(output.numel())), redopOf(opts.reduceOp), -1,
             [&] { return vendor()._reduce_scatter_base(output, input, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  return run(OpKind::kReduceScatter, Shape::of(inputs, numel(outputs)), redopOf(opts.reduceOp), -1,
             [&] { return vendor().reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                  std::vector<int64_t>& outputSplits,
                                                                  std::vector<int64_t>& inputSplits,
                                                                  const c10d::AllToAllOptions& opts) {
  return run(OpKind::kAllToAll, Shape::of(input, uint64_t(output.numel())), RedOp::kSum, -1,
             [&] { return vendor().alltoall_base(output, input, outputSplits, inputSplits, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions& opts) {
  return run(OpKind::kAllToAll, Shape::of(inputs, numel(outputs)), RedOp::kSum, -1,
             [&] { return vendor().alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return run(OpKind::kSend, Shape::of(tensors), RedOp::kSum, dstRank,
             [&] { return vendor().send(tensors, dstRank, tag); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return run(OpKind::kRecv, Shape::of(tensors), RedOp::kSum, srcRank,
             [&] { return vendor().recv(tensors, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return run(OpKind::kRecv, Shape::of(tensors), RedOp::kSum, -1,
             [&] { return vendor().recvAnysource(tensors, tag); });
}

c10::intrusive_ptr<c10d::Work> InstrumentedBackend::barrier(const c10d::BarrierOptions& opts) {
  return run(OpKind::kBarrier, Shape{}, RedOp::kSum, -1, [&] { return vendor().barrier(opts); });
}

void InstrumentedBackend::shutdown() {
  if (!inner_) return;
  inner_->shutdown();
  inner_.reset();
}

void InstrumentedBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  ExternalOp rec;
  rec.op = OpKind::kBarrier;
  uint64_t token = external_.begin(rec);
  try {
    vendor().monitoredBarrier(opts, waitAllRanks);
  } catch (const std::exception& e) {
    external_.end(token, false, e.what());
    throw;
  }
  external_.end(token, true);
}

}  // namespace hetobs::torch_ext
