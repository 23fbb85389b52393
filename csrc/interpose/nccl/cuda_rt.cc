#include "cuda_rt.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <string>

#include "hetobs/common/cuda_loader.h"
#include "hetobs/common/log.h"

namespace hetobs {
namespace nccl {
namespace {

template <class F>
bool sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

CudaRt* load() {
  std::string used;
  void* lib = openCudaRuntime(&used);
  if (!lib) return nullptr;
  auto* rt = new CudaRt();  // leaked: used until the very end of the process
  bool ok = sym(lib, "cudaEventCreateWithFlags", &rt->eventCreateWithFlags) &&
            sym(lib, "cudaEventRecord", &rt->eventRecord) && sym(lib, "cudaEventQuery", &rt->eventQuery) &&
            sym(lib, "cudaEventElapsedTime", &rt->eventElapsedTime) && sym(lib, "cudaGetDevice", &rt->getDevice) &&
            sym(lib, "cudaSetDevice", &rt->setDevice) &&
            sym(lib, "cudaStreamIsCapturing", &rt->streamIsCapturing) &&
            sym(lib, "cudaGetLastError", &rt->getLastError) && sym(lib, "cudaGetErrorString", &rt->getErrorString);
  if (!ok) {
    HETOBS_WARN("NCCL interposer: %s lacks a CUDA runtime function it needs; NCCL ops are not recorded",
                used.c_str());
    delete rt;
    return nullptr;
  }
  rt->path = strdup(used.c_str());
  return rt;
}

}  // namespace

const CudaRt* cudaRt() {
  static std::once_flag once;
  static CudaRt* rt = nullptr;
  std::call_once(once, [] { rt = load(); });
  return rt;
}

DeviceGuard::DeviceGuard(const CudaRt& rt, int device) : rt_(rt) {
  if (device < 0) return;
  int cur = -1;
  if (rt_.getDevice(&cur) != cudaSuccess) {
    rt_.getLastError();
    cur = -1;
  }
  if (cur == device) return;
  if (rt_.setDevice(device) != cudaSuccess) {
    rt_.getLastError();
    ok_ = false;
    return;
  }
  prev_ = cur;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0 && rt_.setDevice(prev_) != cudaSuccess) rt_.getLastError();
}

}  // namespace nccl
}  // namespace hetobs
