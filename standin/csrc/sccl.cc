// "sccl": the stand-in device's own collective library, a c10d C++ backend as a vendor's
// (torch_npu's ProcessGroupHCCL, ...) is, registered with torch.distributed under its own
// name for the "standin" device. It carries its collectives over host memory: the
// device's copy engine moves each tensor to pinned host memory on the caller's current
// stream, a host library (Gloo, handed in by the creator) runs the collective, and the
// result goes back to the device asynchronously on the same stream (ordered before any
// later work of the caller's, as a vendor library's stream-ordered completion is).
// Not modelled: device-side reductions, a device-to-device network, overlap of the host
// collective with the copies; the op is synchronous on the host until the host
// collective ends.
#include <ATen/EmptyTensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "memory.h"
#include "runtime.h"
#include "sccl.h"

namespace standin {
namespace {

class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> result) : future_(c10::make_intrusive<c10::ivalue::Future>(
                                                           c10::ListType::create(c10::TensorType::get()))) {
    future_->markCompleted(c10::IValue(result));
    finish();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

at::Tensor pinnedLike(const at::Tensor& t) {
  return at::detail::empty_generic(t.sizes(), pinnedAllocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   t.scalar_type(), c10::MemoryFormat::Contiguous);
}

void checkDevice(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.is_privateuseone(), "sccl ", op, ": sccl carries standin tensors only, got a tensor on ", t.device());
}

// The device tensors' bytes in pinned host memory (waits for the device copies).
std::vector<at::Tensor> toHost(const std::vector<at::Tensor>& ts, const char* op, bool copy) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) {
    checkDevice(t, op);
    out.push_back(pinnedLike(t));
    if (copy) out.back().copy_(t, /*non_blocking=*/true);
  }
  for (const at::Tensor& t : ts) currentStream(t.device().index())->synchronize();
  return out;
}

// Results back to the device, queued on the caller's stream (no host wait).
void fromHost(const std::vector<at::Tensor>& host, std::vector<at::Tensor>& dev) {
  for (size_t i = 0; i < dev.size(); ++i) dev[i].copy_(host[i], /*non_blocking=*/true);
}

class ScclBackend final : public c10d::Backend {
 public:
  ScclBackend(c10::intrusive_ptr<c10d::Backend> host, int rank, int size)
      : c10d::Backend(rank, size), host_(std::move(host)) {}

  const std::string getBackendName() const override { return "sccl"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) override {
    auto h = toHost(ts, "all_reduce", true);
    host_->allreduce(h, o)->wait();
    return done(h, ts);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& ts,
                                                     const c10d::AllreduceCoalescedOptions& o) override {
    c10d::AllreduceOptions one;
    one.reduceOp = o.reduceOp;
    one.timeout = o.timeout;
    return allreduce(ts, one);
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts, const c10d::BroadcastOptions& o) override {
    auto h = toHost(ts, "broadcast", true);
    host_->broadcast(h, o)->wait();
    return done(h, ts);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& ts, const c10d::ReduceOptions& o) override {
    auto h = toHost(ts, "reduce", true);
    host_->reduce(h, o)->wait();
    if (rank_ != o.rootRank) return c10::make_intrusive<DoneWork>(ts);  // only the root's tensor changes
    return done(h, ts);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& o) override {
    auto hi = toHost({in}, "all_gather", true);
    auto ho = toHost({out}, "all_gather", false);
    host_->_allgather_base(ho[0], hi[0], o)->wait();
    std::vector<at::Tensor> outs{out};
    return done(ho, outs);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                           const c10d::AllgatherOptions& o) override {
    auto hi = toHost(ins, "all_gather", true);
    std::vector<std::vector<at::Tensor>> ho;
    for (auto& list : outs) ho.push_back(toHost(list, "all_gather", false));
    host_->allgather(ho, hi, o)->wait();
    for (size_t i = 0; i < outs.size(); ++i) fromHost(ho[i], outs[i]);
    return c10::make_intrusive<DoneWork>(ins);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& o) override {
    auto hi = toHost({in}, "reduce_scatter", true);
    auto ho = toHost({out}, "reduce_scatter", false);
    host_->_reduce_scatter_base(ho[0], hi[0], o)->wait();
    std::vector<at::Tensor> outs{out};
    return done(ho, outs);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outs,
                                                std::vector<std::vector<at::Tensor>>& ins,
                                                const c10d::ReduceScatterOptions& o) override {
    auto ho = toHost(outs, "reduce_scatter", false);
    std::vector<std::vector<at::Tensor>> hi;
    for (auto& list : ins) hi.push_back(toHost(list, "reduce_scatter", true));
    host_->reduce_scatter(ho, hi, o)->wait();
    return done(ho, outs);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outSplits,
                                               std::vector<int64_t>& inSplits,
                                               const c10d::AllToAllOptions& o) override {
    auto hi = toHost({in}, "all_to_all", true);
    auto ho = toHost({out}, "all_to_all", false);
    host_->alltoall_base(ho[0], hi[0], outSplits, inSplits, o)->wait();
    std::vector<at::Tensor> outs{out};
    return done(ho, outs);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& ts, int dst, int tag) override {
    auto h = toHost(ts, "send", true);
    host_->send(h, dst, tag)->wait();
    return c10::make_intrusive<DoneWork>(ts);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& ts, int src, int tag) override {
    auto h = toHost(ts, "recv", false);
    host_->recv(h, src, tag)->wait();
    return done(h, ts);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    host_->barrier(o)->wait();
    return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{});
  }

 private:
  c10::intrusive_ptr<c10d::Work> done(const std::vector<at::Tensor>& host, std::vector<at::Tensor>& dev) {
    fromHost(host, dev);
    return c10::make_intrusive<DoneWork>(dev);
  }

  c10::intrusive_ptr<c10d::Backend> host_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> makeSccl(c10::intrusive_ptr<c10d::Backend> host, int rank, int size) {
  TORCH_CHECK(host, "sccl: no host library to carry the collectives");
  return c10::make_intrusive<ScclBackend>(std::move(host), rank, size);
}

}  // namespace standin
