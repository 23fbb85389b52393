#include "completion_poller.h"

#include <chrono>
#include <thread>

#include "instrumented_work.h"

namespace hetobs::torch_ext {

CompletionPoller& CompletionPoller::instance() {
  // Never destroyed: the thread may still be polling while the process exits.
  static CompletionPoller* poller = new CompletionPoller();
  return *poller;
}

CompletionPoller::CompletionPoller() {
  for (auto& s : slots_) s.store(nullptr, std::memory_order_relaxed);
  std::thread([this] { run(); }).detach();
}

bool CompletionPoller::watch(const c10::intrusive_ptr<InstrumentedWork>& work) {
  InstrumentedWork* raw = c10::intrusive_ptr<InstrumentedWork>(work).release();  // the slot's reference
  size_t start = cursor_.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < kSlots; ++i) {
    InstrumentedWork* empty = nullptr;
    auto& slot = slots_[(start + i) % kSlots];
    if (slot.load(std::memory_order_relaxed) == nullptr &&
        slot.compare_exchange_strong(empty, raw, std::memory_order_acq_rel)) {
      if (used_.fetch_add(1, std::memory_order_acq_rel) == 0) idle_.notify_one();
      return true;
    }
  }
  c10::intrusive_ptr<InstrumentedWork>::reclaim(raw);  // gives the reference back
  return false;
}

void CompletionPoller::run() {
  for (;;) {
    if (used_.load(std::memory_order_acquire) == 0) {
      // A watch() racing with this check is seen within the timeout at worst.
      std::unique_lock<std::mutex> lk(idleMu_);
      idle_.wait_for(lk, std::chrono::milliseconds(10));
      continue;
    }
    for (auto& slot : slots_) {
      InstrumentedWork* w = slot.load(std::memory_order_acquire);
      if (w == nullptr || !w->poll()) continue;
      slot.store(nullptr, std::memory_order_release);
      used_.fetch_sub(1, std::memory_order_acq_rel);
      c10::intrusive_ptr<InstrumentedWork>::reclaim(w);  // drops the slot's reference
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace hetobs::torch_ext
