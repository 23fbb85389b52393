// hetobs._core: the native core. This file only wires the parts together.
#include <pybind11/pybind11.h>

#include "register.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "hetobs native core: transport, collectives, recorder";
  m.attr("__version__") = HETOBS_VERSION;
  hetobs::bindings::registerErrors(m);
  hetobs::bindings::registerComm(m);
  hetobs::bindings::registerRecords(m);
}
