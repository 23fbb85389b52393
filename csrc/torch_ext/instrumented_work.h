#pragma once
// The Work handed back to torch for a vendor op: the vendor's own Work, plus the end of
// the op's record, written exactly once by whichever comes first:
// - the vendor future's callback (CPU collectives: also async ops that are never waited
//   on, e.g. DDP's bucket all_reduce chained with .then()),
// - wait() or isCompleted() returning done (Gloo's send, recv and reduce_scatter have
//   no future),
// - the completion poller (device ops: isCompleted() asks the op's CUDA event; the hot
//   path never synchronizes a stream),
// - release of the Work before any of these (recorded as not waited on).
#include <atomic>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace hetobs::torch_ext {

class InstrumentedBackend;

class InstrumentedWork : public c10d::Work {
 public:
  InstrumentedWork(c10::intrusive_ptr<c10d::Work> inner, c10::intrusive_ptr<InstrumentedBackend> backend,
                   uint64_t token);
  ~InstrumentedWork() override;

  // From a pool of fixed blocks (work_pool.h): no allocation per op.
  static void* operator new(size_t size);
  static void operator delete(void* p) noexcept;

  // Record completion from the vendor future (call once, right after construction);
  // false when the vendor's Work has no future (Gloo's reduce_scatter, send, recv).
  bool finishFromFuture();
  // Poller: true once the op is finished (recorded as such).
  bool poll() noexcept;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void blockCurrentStream() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override;
  float getDuration() const override;
  uint64_t getSequencenumber() const override;

 private:
  void finish(bool ok, const char* error) noexcept;
  void finishFromInner() noexcept;  // the vendor says the op is complete: ok or its error

  c10::intrusive_ptr<c10d::Work> inner_;
  c10::intrusive_ptr<InstrumentedBackend> backend_;
  uint64_t token_;
  std::atomic<bool> ended_{false};
  // A finished Gloo send/recv must not be waited on twice (the second wait blocks forever).
  std::atomic<bool> waited_{false};
};

}  // namespace hetobs::torch_ext
