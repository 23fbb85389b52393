#pragma once
// The CUDA runtime, loaded at run time (never linked): the interposer times NCCL ops
// with CUDA events and needs nothing else. A libcudart already in the process is
// preferred (the application's own copy); otherwise libcudart.so.13, .12, .11.0 or
// plain libcudart.so is opened. Without one the interposer stays inert.
#include "nccl_api.h"

namespace hetobs {
namespace nccl {

struct CudaRt {
  cudaError_t (*eventCreateWithFlags)(cudaEvent_t* event, unsigned int flags);
  cudaError_t (*eventRecord)(cudaEvent_t event, cudaStream_t stream);
  cudaError_t (*eventQuery)(cudaEvent_t event);
  cudaError_t (*eventElapsedTime)(float* ms, cudaEvent_t start, cudaEvent_t end);
  cudaError_t (*getDevice)(int* device);
  cudaError_t (*setDevice)(int device);
  cudaError_t (*streamIsCapturing)(cudaStream_t stream, cudaStreamCaptureStatus* status);
  cudaError_t (*getLastError)();
  const char* (*getErrorString)(cudaError_t error);
  const char* path = "";  // the library that was used
};

// Loaded once (thread-safe); nullptr when no usable libcudart was found.
const CudaRt* cudaRt();

// Make `device` current on this thread for the lifetime of the guard (only when it differs).
class DeviceGuard {
 public:
  DeviceGuard(const CudaRt& rt, int device);
  ~DeviceGuard();
  bool ok() const { return ok_; }

 private:
  const CudaRt& rt_;
  int prev_ = -1;
  bool ok_ = true;
};

}  // namespace nccl
}  // namespace hetobs
