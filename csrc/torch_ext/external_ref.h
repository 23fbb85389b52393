#pragma once
// One owned reference to an ExternalComm of hetobs._core, reached through the C table
// (hetobs/observe/external_hooks.h): this extension links no copy of the core.
#include <string>

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
  bool digestDue(uint64_t token) const noexcept { return hooks_->digest_due(comm_, token); }
  // ExternalHooks::check_result; *msg: what to tell the job (a mismatch) or why the check failed.
  int checkResult(uint64_t token, uint8_t* data, uint64_t count, uint32_t es,
                  int (*gather)(void*, const uint8_t*, uint64_t, uint8_t*), void* ctx, std::string* msg) const noexcept {
    char text[1024];
    text[0] = '\0';
    int rc = hooks_->check_result(comm_, token, data, count, es, gather, ctx, text, sizeof text);
    msg->assign(text);
    return rc;
  }

 private:
  const ExternalHooks* hooks_;
  void* comm_;
};

}  // namespace hetobs::torch_ext
