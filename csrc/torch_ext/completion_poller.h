#pragma once
// Finishes the records of device ops (NCCL, or Gloo on CUDA tensors): one thread asks
// each watched Work isCompleted() — a CUDA event query, never a stream synchronize —
// every 200 us while any is watched, and sleeps otherwise. watch() claims a slot with
// compare-and-swap: no lock and no allocation on the op's path.
#include <atomic>
#include <condition_variable>
#include <mutex>

#include <c10/util/intrusive_ptr.h>

namespace hetobs::torch_ext {

class InstrumentedWork;

class CompletionPoller {
 public:
  static CompletionPoller& instance();
  // Holds a reference to `work` until it finishes; false when every slot is taken.
  bool watch(const c10::intrusive_ptr<InstrumentedWork>& work);

 private:
  static constexpr size_t kSlots = 1024;
  CompletionPoller();
  void run();

  std::atomic<InstrumentedWork*> slots_[kSlots];
  std::atomic<size_t> used_{0};
  std::atomic<size_t> cursor_{0};
  std::mutex idleMu_;  // only the poller waits on it, when nothing is watched
  std::condition_variable idle_;
};

}  // namespace hetobs::torch_ext
