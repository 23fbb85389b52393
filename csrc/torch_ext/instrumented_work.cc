#include "instrumented_work.h"

#include <ATen/core/ivalue.h>

#include "instrumented_backend.h"
#include "work_pool.h"

namespace hetobs::torch_ext {
namespace {

// As many Works as ops that may be alive at once in a process: DDP keeps one per bucket,
// a pipeline or an isend/irecv ring a few hundred.
using WorkPool = BlockPool<sizeof(InstrumentedWork), 4096>;

WorkPool& pool() {
  static WorkPool* p = new WorkPool();  // leaked: Works may be released during exit
  return *p;
}

}  // namespace

void* InstrumentedWork::operator new(size_t size) {
  return size == sizeof(InstrumentedWork) ? pool().allocate() : ::operator new(size);
}

void InstrumentedWork::operator delete(void* p) noexcept { pool().release(p); }

InstrumentedWork::InstrumentedWork(c10::intrusive_ptr<c10d::Work> inner,
                                   c10::intrusive_ptr<InstrumentedBackend> backend, uint64_t token)
    : c10d::Work(backend->getRank(), inner->retrieveOpType()),
      inner_(std::move(inner)),
      backend_(std::move(backend)),
      token_(token) {}

InstrumentedWork::~InstrumentedWork() {
  if (!ended_.load(std::memory_order_acquire)) finish(false, "work released before it was waited on");
}

void InstrumentedWork::finish(bool ok, const char* error) noexcept {
  if (!ended_.exchange(true, std::memory_order_acq_rel)) backend_->external().end(token_, ok, error);
}

bool InstrumentedWork::finishFromFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = inner_->getFuture();
  } catch (const std::exception&) {
    return false;
  }
  // The callback holds a reference to the Work until the vendor completes the op (the future
  // drops its callbacks once they ran, so no cycle outlives it). Taken by hand: a lambda of
  // one raw pointer fits in std::function's own storage, where an intrusive_ptr would be
  // copied to the heap, once per op.
  c10::raw::intrusive_ptr::incref(this);
  try {
    future->addCallback(
        [self = this](c10::ivalue::Future& f) {
          auto owned = c10::intrusive_ptr<InstrumentedWork>::reclaim(self);
          if (f.hasError()) owned->finish(false, f.tryRetrieveErrorMessage().c_str());
          else owned->finish(true, nullptr);
        },
        /*uses_future=*/false);
  } catch (...) {
    c10::raw::intrusive_ptr::decref(this);
    throw;
  }
  return true;
}

void InstrumentedWork::finishFromInner() noexcept {
  try {
    if (std::exception_ptr e = inner_->exception()) std::rethrow_exception(e);
    finish(true, nullptr);
  } catch (const std::exception& e) {
    finish(false, e.what());
  } catch (...) {
    finish(false, "the vendor op failed");
  }
}

bool InstrumentedWork::poll() noexcept {
  if (ended_.load(std::memory_order_acquire)) return true;
  try {
    if (!inner_->isCompleted()) return false;
  } catch (const std::exception& e) {
    finish(false, e.what());
    return true;
  }
  finishFromInner();
  return true;
}

bool InstrumentedWork::isCompleted() {
  bool done = inner_->isCompleted();
  if (done && !ended_.load(std::memory_order_acquire)) finishFromInner();
  return done;
}

bool InstrumentedWork::isSuccess() const { return inner_->exception() == nullptr; }
std::exception_ptr InstrumentedWork::exception() const { return inner_->exception(); }
int InstrumentedWork::sourceRank() const { return inner_->sourceRank(); }
std::vector<at::Tensor> InstrumentedWork::result() { return inner_->result(); }
void InstrumentedWork::synchronize() { inner_->synchronize(); }

bool InstrumentedWork::wait(std::chrono::milliseconds timeout) {
  if (waited_.load(std::memory_order_acquire)) return true;
  bool r;
  try {
    r = inner_->wait(timeout);
  } catch (const std::exception& e) {
    finish(false, e.what());
    throw;
  }
  waited_.store(true, std::memory_order_release);
  finish(true, nullptr);
  return r;
}

void InstrumentedWork::blockCurrentStream() { inner_->blockCurrentStream(); }
void InstrumentedWork::abort() { inner_->abort(); }
c10::intrusive_ptr<c10::ivalue::Future> InstrumentedWork::getFuture() { return inner_->getFuture(); }
c10::intrusive_ptr<c10::ivalue::Future> InstrumentedWork::getFutureResult() { return inner_->getFutureResult(); }
float InstrumentedWork::getDuration() const { return inner_->getDuration(); }
uint64_t InstrumentedWork::getSequencenumber() const { return inner_->getSequencenumber(); }

}  // namespace hetobs::torch_ext
