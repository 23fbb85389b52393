// Native exceptions surface as the classes of hetobs.errors, so Python code catches
// hetobs.PeerError whether the error was born in C++ or Python.
#include <pybind11/pybind11.h>

#include "hetobs/common/connect_retry.h"
#include "hetobs/common/error.h"
#include "hetobs/common/json.h"
#include "register.h"

namespace py = pybind11;

namespace hetobs {
namespace bindings {

void registerErrors(py::module_& m) {
  py::module_ errors = py::module_::import("hetobs.errors");
  // Leaked references: the translator outlives module teardown order.
  static PyObject* base = py::object(errors.attr("HetobsError")).release().ptr();
  static PyObject* peer = py::object(errors.attr("PeerError")).release().ptr();
  static PyObject* mismatch = py::object(errors.attr("MismatchError")).release().ptr();
  static PyObject* timeout = py::object(errors.attr("OpTimeoutError")).release().ptr();
  static PyObject* aborted = py::object(errors.attr("CommAbortedError")).release().ptr();
  static PyObject* auth = py::object(errors.attr("AuthError")).release().ptr();
  static PyObject* data = py::object(errors.attr("DataMismatchError")).release().ptr();
  // Messages may quote peers' host names and OS text: made valid UTF-8 first, or Python
  // would raise UnicodeDecodeError in place of the error itself.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const MismatchError& e) {
      PyErr_SetString(mismatch, utf8Valid(e.what()).c_str());
    } catch (const ConnectError& e) {
      // Structured fields beside the message, so callers never parse our English.
      py::gil_scoped_acquire gil;
      py::object exc = py::reinterpret_borrow<py::object>(peer)(utf8Valid(e.what()));
      exc.attr("peer_rank") = e.peer;
      exc.attr("address") = e.address;
      exc.attr("attempts") = e.attempts;
      PyErr_SetObject(peer, exc.ptr());
    } catch (const PeerError& e) {
      PyErr_SetString(peer, utf8Valid(e.what()).c_str());
    } catch (const TimeoutError& e) {
      PyErr_SetString(timeout, utf8Valid(e.what()).c_str());
    } catch (const AbortedError& e) {
      PyErr_SetString(aborted, utf8Valid(e.what()).c_str());
    } catch (const DataMismatchError& e) {
      py::gil_scoped_acquire gil;
      py::object exc = py::reinterpret_borrow<py::object>(data)(utf8Valid(e.what()));
      py::list ranks;
      for (int r : e.ranks) ranks.append(r);
      exc.attr("ranks") = ranks;
      exc.attr("op") = e.op;
      exc.attr("comm") = e.comm;
      exc.attr("seq") = e.seq;
      exc.attr("element") = e.element >= 0 ? py::object(py::int_(e.element)) : py::object(py::none());
      PyErr_SetObject(data, exc.ptr());
    } catch (const AuthError& e) {
      PyErr_SetString(auth, utf8Valid(e.what()).c_str());
    } catch (const Error& e) {
      PyErr_SetString(base, utf8Valid(e.what()).c_str());
    }
  });
  m.attr("HetobsError") = errors.attr("HetobsError");
}

}  // namespace bindings
}  // namespace hetobs
