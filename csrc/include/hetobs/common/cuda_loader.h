#pragma once
// Finding the CUDA runtime at run time (the core never links CUDA). A libcudart already
// in the process is preferred (the application's own copy); otherwise libcudart.so.13,
// .12, .11.0 or plain libcudart.so, as the loader finds them (LD_LIBRARY_PATH included).
#include <string>

namespace hetobs {

// dlopen handle of a CUDA runtime, or nullptr; *used names the library that was opened.
void* openCudaRuntime(std::string* used);

}  // namespace hetobs
