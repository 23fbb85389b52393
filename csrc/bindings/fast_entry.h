#pragma once
// The fast entries from Python: a small blocking op on numpy arrays, checked in C on the
// arrays' own fields, without pybind11's per-call dispatch or a Python frame. Whatever they
// decline (another type, a view, an unusual dtype or argument) goes to hetobs/comm.py's
// general path, which checks and explains it.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "hetobs/comm/communicator.h"

namespace hetobs {
namespace bindings {

// Releases the GIL with PyEval_SaveThread directly: pybind11's gil_scoped_release also looks
// up its internals and thread-state key, measurable on an op of ~1 us.
struct ReleaseGil {
  PyThreadState* state = PyEval_SaveThread();
  ~ReleaseGil() { PyEval_RestoreThread(state); }
};

// Whether a blocking in-place all_reduce of `x` with reduction code `redop` may run here
// (then *a is filled); false when `x` or `redop` needs the general path.
bool fastAllReduceArgs(PyObject* x, long redop, OpArgs* a);

// `op`'s fast path bound to `c` as a C function: all_reduce(x, redop), all_gather(out, x),
// reduce_scatter(out, x, redop), broadcast(x, root); True when it ran the op, False (nothing
// run) when its arguments need the general path.
pybind11::object fastEntry(std::shared_ptr<Communicator> c, const std::string& op);

// The public method `op` of one hetobs.Communicator as a C function: the commonest call
// (all_reduce(x), all_gather(out, x), reduce_scatter(out, x), broadcast(x[, root]), on numpy
// arrays, no keywords) runs here and returns None; any other call, and one the fast path
// declines, goes to `method` (the class's function) with `owner` (held weakly: the instance
// stores this function, and a strong reference would make a cycle) as its first argument.
pybind11::object fastFront(std::shared_ptr<Communicator> c, const std::string& op, pybind11::object method,
                           pybind11::object owner);

}  // namespace bindings
}  // namespace hetobs
