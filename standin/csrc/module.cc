// hetobs_standin._C: loads the stand-in device into torch (guard, hooks, kernels are
// registered by static initialisers and registerMemory()) and exposes its driver's
// knobs and counters, and the sccl backend's constructor.
#include <torch/csrc/utils/pybind.h>

#include "memory.h"
#include "runtime.h"
#include "sccl.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "The stand-in accelerator (a PrivateUse1 device for tests) and its collective library sccl";
  standin::registerMemory();
  m.def("device_count", &standin::deviceCount);
  m.def("current_device", &standin::currentDevice);
  m.def("set_device", &standin::setCurrentDevice, py::arg("device"));
  m.def("synchronize", [](int device) {
    py::gil_scoped_release nogil;
    standin::synchronizeDevice(device < 0 ? standin::currentDevice() : device);
  }, py::arg("device") = -1);
  m.def("set_copy_bandwidth", &standin::setBandwidth, py::arg("h2d_gbps"), py::arg("d2h_gbps"),
        "Pace the copy engines of every device (GB/s; 0: unpaced).");
  m.def("engine_stats", [](int device) {
    py::dict d;
    for (auto [name, dir] : {std::pair{"h2d", standin::Direction::kH2D}, std::pair{"d2h", standin::Direction::kD2H}}) {
      standin::Engine& e = standin::engine(device, dir);
      py::dict s;
      s["bytes"] = e.bytes.load();
      s["copies"] = e.copies.load();
      s["busy_ns"] = e.busy_ns.load();
      s["gbps"] = e.bytes_per_ns;
      d[name] = s;
    }
    return d;
  }, py::arg("device") = 0, "Bytes, copies and busy time of each copy engine of `device` since start.");
  m.def("device_bytes_in_use", &standin::deviceBytesInUse);
  m.def("host_waits", [](int device, int stream) { return standin::stream(device, stream)->host_waits.load(); },
        py::arg("device"), py::arg("stream_id"), "Times a host thread blocked on that stream so far.");
  m.def("is_device_address", [](uintptr_t p) { return standin::isDevicePtr(reinterpret_cast<void*>(p)); });
  m.def("make_sccl", &standin::makeSccl, py::arg("host"), py::arg("rank"), py::arg("size"),
        "sccl over `host`, a c10d backend of host memory (a ProcessGroupGloo).");
}
