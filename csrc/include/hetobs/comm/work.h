#pragma once
// Completion state of one submitted op, shared by the runner and whoever waits.
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>

namespace hetobs {

class Work {
 public:
  void finish(std::exception_ptr error);
  bool isCompleted();
  // Wait up to timeoutS seconds (negative: forever). Returns false on timeout;
  // rethrows the op's error.
  bool wait(double timeoutS);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace hetobs
