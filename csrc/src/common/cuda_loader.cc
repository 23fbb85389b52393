#include "hetobs/common/cuda_loader.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>

namespace hetobs {
namespace {

int findLoaded(struct dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (name && strstr(name, "/libcudart.so")) {
    *static_cast<std::string*>(out) = name;
    return 1;
  }
  return 0;
}

}  // namespace

void* openCudaRuntime(std::string* used) {
  static const char* kNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
  void* lib = nullptr;
  for (const char* n : kNames) {
    if ((lib = dlopen(n, RTLD_NOW | RTLD_NOLOAD))) {
      *used = n;
      return lib;
    }
  }
  std::string path;
  dl_iterate_phdr(findLoaded, &path);
  if (!path.empty() && (lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD))) {
    *used = path;
    return lib;
  }
  for (const char* n : kNames) {
    if ((lib = dlopen(n, RTLD_NOW | RTLD_LOCAL))) {
      *used = n;
      return lib;
    }
  }
  return nullptr;
}

}  // namespace hetobs
