#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace standin {

// The stand-in's collective library over `host`, a c10d backend of host memory (Gloo).
c10::intrusive_ptr<c10d::Backend> makeSccl(c10::intrusive_ptr<c10d::Backend> host, int rank, int size);

}  // namespace standin
