#pragma once
// A torch ProcessGroup that answers getBackendName() with the plugin's name ("hetobs_gloo").
// torch makes every group of a backend registered with register_backend() a ProcessGroup of
// type CUSTOM, whose name is "custom": DDP's logging data (backend_name) and every message
// that names the group's backend then said "custom" where Gloo's say "gloo". The creator hands
// torch this group instead, with the instrumented backends registered on it as torch would.
#include <string>
#include <utility>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace hetobs::torch_ext {

class NamedProcessGroup : public c10d::ProcessGroup {
 public:
  NamedProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string name)
      : c10d::ProcessGroup(std::move(store), rank, size), name_(std::move(name)) {}

  const std::string getBackendName() const override { return name_; }

 private:
  const std::string name_;
};

}  // namespace hetobs::torch_ext
