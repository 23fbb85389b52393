// hetobs._torch_ext: the instrumented c10d backend, built against the torch found at build
// time (hetobs.torch falls back to its Python wrapper when this module is missing or was
// built for another torch).
#include <torch/csrc/utils/pybind.h>

#include "device_lane.h"
#include "instrumented_backend.h"
#include "named_group.h"

namespace py = pybind11;
using hetobs::ExternalHandle;
using hetobs::torch_ext::InstrumentedBackend;

#ifndef HETOBS_TORCH_VERSION
#error "HETOBS_TORCH_VERSION: the torch version this module is built against"
#endif

PYBIND11_MODULE(_torch_ext, m) {
  m.doc() = "Instrumented c10d backend wrapping a vendor backend (Gloo, NCCL)";
  m.attr("TORCH_VERSION") = HETOBS_TORCH_VERSION;
  m.attr("HOOKS_ABI") = hetobs::kExternalHooksAbi;
  m.def(
      "instrument",
      [](c10::intrusive_ptr<c10d::Backend> inner, py::capsule external, std::string name,
         bool deviceOps) -> c10::intrusive_ptr<c10d::Backend> {
        if (!inner) throw py::value_error("instrument: no vendor backend to wrap");
        if (std::string(external.name() ? external.name() : "") != hetobs::kExternalHooksCapsule) {
          throw py::type_error("instrument: `external` must come from hetobs._core.ExternalComm._hooks()");
        }
        auto* handle = external.get_pointer<ExternalHandle>();
        if (handle->hooks->abi != hetobs::kExternalHooksAbi) {
          throw py::type_error("instrument: hetobs._core and hetobs._torch_ext were built from different sources");
        }
        return c10::make_intrusive<InstrumentedBackend>(std::move(inner), *handle, std::move(name), deviceOps);
      },
      py::arg("inner"), py::arg("external"), py::arg("name"), py::arg("device_ops"),
      "Wrap a vendor c10d backend so every op is recorded in `external` (an ExternalComm's hooks).");
  m.def(
      "device_lane_hooks",
      [] {
        return py::capsule(const_cast<hetobs::DeviceLaneHooks*>(hetobs::torch_ext::deviceLaneHooks()),
                           hetobs::kDeviceLaneHooksCapsule);
      },
      "The relay's copy lane for any torch device, for hetobs._core.set_device_lane_hooks().");
  m.def(
      "named_group",
      [](c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string name)
          -> c10::intrusive_ptr<c10d::ProcessGroup> {
        return c10::make_intrusive<hetobs::torch_ext::NamedProcessGroup>(std::move(store), rank, size,
                                                                         std::move(name));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("name"),
      "An empty ProcessGroup whose getBackendName() is `name`; register its backends on it.");
}
