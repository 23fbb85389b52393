#pragma once
// A c10d::Backend that records every op of a vendor backend (Gloo, NCCL) in hetobs and
// hands the op to it unchanged. Registered by hetobs.torch for "hetobs_gloo",
// "hetobs_nccl" and wrap(group), so torch dispatches to it like to Gloo itself: no
// Python on the per-op path (a Python ProcessGroup costs ~20 us per call here).
#include <atomic>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "external_ref.h"

namespace hetobs::torch_ext {

class InstrumentedBackend : public c10d::Backend {
 public:
  // deviceOps: the vendor completes ops on a device stream (NCCL): every op goes to the
  // completion poller. Otherwise only ops on device tensors do.
  InstrumentedBackend(c10::intrusive_ptr<c10d::Backend> inner, const ExternalHandle& external, std::string name,
                      bool deviceOps);

  const ExternalRef& external() const { return external_; }

  const std::string getBackendName() const override { return name_; }
  bool supportsCoalescing() const override { return inner_ && inner_->supportsCoalescing(); }
  void startCoalescing() override { vendor().startCoalescing(); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override { return vendor().endCoalescing(); }
  void setTimeout(std::chrono::milliseconds timeout) override { vendor().setTimeout(timeout); }
  c10::intrusive_ptr<Options> getBackendOptions() override { return vendor().getBackendOptions(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  void setSequenceNumberForGroup() override { vendor().setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return vendor().getSequenceNumberForGroup(); }
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override {
    vendor().registerOnCompletionHook(std::move(hook));
  }
  void waitForPendingWorks() override { vendor().waitForPendingWorks(); }
  void enableCollectivesTiming() override { vendor().enableCollectivesTiming(); }
  void setGroupUid(const std::string& uid) override {
    c10d::Backend::setGroupUid(uid);
    vendor().setGroupUid(uid);
  }
  void eagerConnectSingleDevice(at::Device device) override { vendor().eagerConnectSingleDevice(device); }
  c10d::ErrorType getError() override { return inner_ ? inner_->getError() : c10d::ErrorType::SUCCESS; }
  void abort() override {
    if (inner_) inner_->abort();
  }
  // torch's destroy_process_group() shuts every group down, then drops its own references.
  // A wrapped group the caller still holds (wrap()) must not keep the vendor backend, and
  // its worker threads, alive into interpreter exit: there they abort the process when
  // they release the last reference to a Python tensor.
  void shutdown() override;

 private:
  struct Shape;  // what the record says about the op's tensors
  // `result`: returns the tensors that must be bit-identical on every rank once the op
  // completes (all_reduce, broadcast, all_gather's output), for result digests; called only
  // for a sampled op. nullptr: the op has no such result.
  template <typename Call, typename Result = std::nullptr_t>
  c10::intrusive_ptr<c10d::Work> run(OpKind op, const Shape& shape, RedOp redop, int rootOrPeer, Call&& call,
                                     Result&& result = nullptr);
  // A sampled op (HETOBS_DIGEST): wait for it, compare its result's digest across ranks through
  // the vendor's own all_gather, and end it failed and raise on a mismatch (unless the action is "log").
  void checkResult(uint64_t token, c10d::Work& inner, const std::vector<at::Tensor>& result);

  // The vendor backend; an error once shut down (torch allows no op after that).
  c10d::Backend& vendor() const {
    TORCH_CHECK(inner_, name_, ": the process group was shut down");
    return *inner_;
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  ExternalRef external_;
  std::string name_;
  bool deviceOps_;
  // Op kinds whose vendor Work has no future: their records end at wait()/isCompleted().
  std::atomic<bool> noFuture_[size_t(OpKind::kCount)] = {};
};

}  // namespace hetobs::torch_ext
