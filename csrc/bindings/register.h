#pragma once
#include <pybind11/pybind11.h>

namespace hetobs {
namespace bindings {

void registerErrors(pybind11::module_& m);
void registerComm(pybind11::module_& m);
void registerRecords(pybind11::module_& m);

}  // namespace bindings
}  // namespace hetobs
