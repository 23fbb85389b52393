#include "hetobs/comm/work.h"

#include <chrono>
#include <cmath>

namespace hetobs {

void Work::finish(std::exception_ptr error) {
  std::lock_guard<std::mutex> g(mu_);
  done_ = true;
  error_ = error;
  cv_.notify_all();
}

bool Work::isCompleted() {
  std::lock_guard<std::mutex> g(mu_);
  return done_;
}

bool Work::wait(double timeoutS) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeoutS < 0 || !std::isfinite(timeoutS)) {  // inf: no limit (chrono would overflow)
    cv_.wait(lk, [&] { return done_; });
  } else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeoutS), [&] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

}  // namespace hetobs
