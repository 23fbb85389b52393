#pragma once
// One owned reference to an ExternalComm of hetobs._core, reached through the C table
// (hetobs/observe/external_hooks.h): this extension links no copy of the core.
#include "hetobs/observe/external_hooks.h"

namespace hetobs::torch_ext {

class ExternalRef {
 public:
  explicit ExternalRef(const ExternalHandle& h) : hooks_(h.hooks), comm_(h.hooks->retain(h.comm)) {}
  ~ExternalRef() { hooks_->release(comm_); }
  ExternalRef(const ExternalRef&) = delete;
  ExternalRef& operator=(const ExternalRef&) = delete;

  uint64_t begin(const ExternalOp& op) const noexcept { return hooks_->begin(comm_, &op); }
  void end(uint64_t token, bool ok, const char* error = nullptr) const noexcept { hooks_->end(comm_, token, ok, error); }

 private:
  const ExternalHooks* hooks_;
  void* comm_;
};

}  // namespace hetobs::torch_ext
