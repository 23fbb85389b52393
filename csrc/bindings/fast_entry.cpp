// The fast entries (fast_entry.h): the numpy checks, one fill per op, and the two kinds of C
// function made from them (an entry that says whether it ran, a front that falls back).
#include "fast_entry.h"

#include <pybind11/numpy.h>

#include <vector>

#include "hetobs/collectives/algorithm.h"

namespace py = pybind11;

namespace hetobs {
namespace bindings {
namespace {

// The fast path of a blocking in-place all_reduce on a numpy array: the array's own fields
// read here (pybind11's view of numpy's C structs: no buffer-protocol export, no Python
// checks, no ten-argument call). Anything unusual (another type, non-contiguous, read-only,
// byte-swapped, a dtype or reduction needing the careful path) returns false and leaves the
// caller's slow path to explain it.
struct NumpyDType {
  int num;
  DType dtype;
};

const std::vector<NumpyDType>& numpyDTypes() {
  // Built once with the GIL held; "q" (long long) is int64 too under another type number.
  static const std::vector<NumpyDType> table = [] {
    std::vector<NumpyDType> t;
    for (auto [name, d] : {std::pair<const char*, DType>{"int8", DType::kInt8}, {"uint8", DType::kUint8},
                           {"int32", DType::kInt32}, {"int64", DType::kInt64}, {"q", DType::kInt64},
                           {"float16", DType::kFloat16}, {"float32", DType::kFloat32}, {"float64", DType::kFloat64}})
      t.push_back({py::dtype(std::string(name)).num(), d});
    return t;
  }();
  return table;
}

// A C-contiguous native-order numpy array of a dtype the fast paths take, read from the
// array's own fields.
struct NumpyView {
  uint8_t* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kUint8;
  bool writable = false;
};

bool numpyView(PyObject* obj, NumpyView* v) {
  const auto& api = py::detail::npy_api::get();
  if (!api.PyArray_Check_(obj)) return false;
  auto* arr = py::detail::array_proxy(obj);
  if (!(arr->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) return false;
  auto* descr = py::detail::array_descriptor_proxy(arr->descr);
  if (descr->byteorder == '>') return false;
  bool found = false;
  for (const auto& e : numpyDTypes())
    if (e.num == descr->type_num) {
      v->dtype = e.dtype;
      found = true;
      break;
    }
  if (!found) return false;
  size_t count = 1;
  for (int i = 0; i < arr->nd; ++i) count *= size_t(arr->dimensions[i]);
  v->data = reinterpret_cast<uint8_t*>(arr->data);
  v->count = count;
  v->writable = (arr->flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_) != 0;
  return true;
}

// Fills *a's type, pointers and counts from a writable C-contiguous native-order array.
bool numpyInPlace(PyObject* obj, OpArgs* a) {
  NumpyView v;
  if (!numpyView(obj, &v) || !v.writable) return false;
  a->dtype = v.dtype;
  a->send = v.data;
  a->recv = v.data;
  a->send_count = a->recv_count = v.count;
  return true;
}

// *a's buffers from (out, x) arrays of one dtype, out writable.
bool numpyOutIn(PyObject* out, PyObject* x, OpArgs* a) {
  NumpyView o, i;
  if (!numpyView(out, &o) || !o.writable || !numpyView(x, &i) || o.dtype != i.dtype) return false;
  a->dtype = o.dtype;
  a->send = i.data;
  a->send_count = i.count;
  a->recv = o.data;
  a->recv_count = o.count;
  return true;
}

bool floatingDType(DType d) { return d == DType::kFloat16 || d == DType::kFloat32 || d == DType::kFloat64; }

// A reduction code the fast path runs itself: avg only on floating dtypes.
bool fastRedop(long redop, DType dtype, OpArgs* a) {
  if (redop < 0 || redop >= long(RedOp::kOther)) return false;
  a->redop = RedOp(redop);
  return a->redop != RedOp::kAvg || floatingDType(dtype);
}

// A plain Python int (not a bool, a numpy integer or anything else the general path
// explains), fitting a long.
bool exactInt(PyObject* o, long* v) {
  if (!PyLong_CheckExact(o)) return false;
  *v = PyLong_AsLong(o);
  if (*v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

}  // namespace

bool fastAllReduceArgs(PyObject* x, long redop, OpArgs* a) {
  a->op = OpKind::kAllReduce;
  return numpyInPlace(x, a) && fastRedop(redop, a->dtype, a);
}

namespace {

// One fill per op: a blocking op on numpy arrays whose every check is made here, on the
// arrays' own fields. A fill returns false (nothing run, no Python error set) for whatever
// the general path in hetobs/comm.py must check or explain.
using FastFill = bool (*)(const Communicator& c, PyObject* const* args, OpArgs* a);

bool fillAllReduce(const Communicator&, PyObject* const* args, OpArgs* a) {
  long redop;
  return exactInt(args[1], &redop) && fastAllReduceArgs(args[0], redop, a);
}

bool fillAllGather(const Communicator& c, PyObject* const* args, OpArgs* a) {
  a->op = OpKind::kAllGather;
  return numpyOutIn(args[0], args[1], a) && a->recv_count == a->send_count * size_t(c.size());
}

bool fillReduceScatter(const Communicator& c, PyObject* const* args, OpArgs* a) {
  a->op = OpKind::kReduceScatter;
  long redop;
  return exactInt(args[2], &redop) && numpyOutIn(args[0], args[1], a) && fastRedop(redop, a->dtype, a) &&
         a->recv_count == blockOf(a->send_count, c.size(), c.rank()).count;
}

bool fillBroadcast(const Communicator& c, PyObject* const* args, OpArgs* a) {
  a->op = OpKind::kBroadcast;
  long root;
  if (!exactInt(args[1], &root) || root < 0 || root >= c.size()) return false;
  a->root_or_peer = int(root);
  return numpyInPlace(args[0], a);
}

struct FastEntry {
  const char* op;
  const char* usage;
  Py_ssize_t nargs;  // the entry's arguments, the last one a reduction code or a root
  // The positional arguments the front runs itself; it fills in a missing last one as 0
  // (the default: sum, root 0). An op name goes to the general path, which also refuses a
  // reduction given as a number.
  Py_ssize_t frontMin, frontMax;
  FastFill fill;
};

const FastEntry kFastEntries[] = {
    {"all_reduce", "all_reduce(x, redop)", 2, 1, 1, fillAllReduce},
    {"all_gather", "all_gather(out, x)", 2, 2, 2, fillAllGather},
    {"reduce_scatter", "reduce_scatter(out, x, redop)", 3, 2, 2, fillReduceScatter},
    {"broadcast", "broadcast(x, root)", 2, 1, 2, fillBroadcast},
};
constexpr size_t kFastCount = sizeof(kFastEntries) / sizeof(kFastEntries[0]);

const FastEntry& entryFor(const std::string& op, const char* caller) {
  for (const FastEntry& e : kFastEntries)
    if (op == e.op) return e;
  throw py::value_error(std::string(caller) + ": no fast path for op '" + op +
                        "' (all_reduce, all_gather, reduce_scatter, broadcast)");
}

// Runs the filled op with the GIL released; false with the Python error set when it raised.
bool submitBlocking(Communicator& c, const OpArgs& a) {
  try {
    ReleaseGil nogil;  // the caller's references keep the arrays (and their memory) alive meanwhile
    c.submit(a, false);
    return true;
  } catch (...) {
    py::detail::try_translate_exceptions();  // the same Python error pybind11 would raise
    return false;
  }
}

// What a bound entry's or front's capsule holds.
struct FastBound {
  std::shared_ptr<Communicator> comm;
  const FastEntry* entry;
};

constexpr const char* kFastCapsule = "hetobs.Communicator.fast";

FastBound* boundOf(PyObject* capsule) {
  return static_cast<FastBound*>(PyCapsule_GetPointer(capsule, kFastCapsule));
}

PyObject* newCapsule(std::shared_ptr<Communicator> c, const FastEntry& e) {
  PyObject* cap = PyCapsule_New(new FastBound{std::move(c), &e}, kFastCapsule, [](PyObject* o) { delete boundOf(o); });
  if (!cap) throw py::error_already_set();
  return cap;
}

// An entry without pybind11's dispatcher (overload loop, argument casters: ~150-200 ns a
// call here): a METH_FASTCALL function bound to a capsule holding the communicator and the
// entry. Returns True when it ran the op, False when it declined.
PyObject* fastRun(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  FastBound* b = boundOf(self);
  if (!b) return nullptr;
  if (nargs != b->entry->nargs) {
    PyErr_Format(PyExc_TypeError, "%s: expected %zd arguments, got %zd", b->entry->usage, b->entry->nargs, nargs);
    return nullptr;
  }
  OpArgs a;
  if (!b->entry->fill(*b->comm, args, &a)) Py_RETURN_FALSE;
  if (!submitBlocking(*b->comm, a)) return nullptr;
  Py_RETURN_TRUE;
}

// The owner behind the front's weak reference, as a new reference; null with an error set
// when it is gone (the front outlived its communicator object).
PyObject* ownerOf(PyObject* ref) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* owner = nullptr;
  if (PyWeakref_GetRef(ref, &owner) == 1) return owner;
#else
  PyObject* owner = PyWeakref_GetObject(ref);  // borrowed
  if (owner && owner != Py_None) {
    Py_INCREF(owner);
    return owner;
  }
#endif
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ReferenceError, "hetobs.Communicator: the communicator is gone");
  return nullptr;
}

// The general path: method(owner, *args, **kwargs), with the call's own argument vector.
PyObject* callGeneral(PyObject* method, PyObject* ownerRef, PyObject* const* args, Py_ssize_t nargs,
                      PyObject* kwnames) {
  PyObject* owner = ownerOf(ownerRef);
  if (!owner) return nullptr;
  Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
  std::vector<PyObject*> full(size_t(total) + 1);
  full[0] = owner;
  for (Py_ssize_t i = 0; i < total; ++i) full[size_t(i) + 1] = args[i];
  PyObject* result = PyObject_Vectorcall(method, full.data(), size_t(nargs) + 1, kwnames);
  Py_DECREF(owner);
  return result;
}

// A front: self is (capsule, method, weakref to the owner). The commonest call runs here
// (no Python frame, no allocation); every other goes to the method unchanged.
PyObject* frontRun(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  FastBound* b = boundOf(PyTuple_GET_ITEM(self, 0));
  if (!b) return nullptr;
  const FastEntry& e = *b->entry;
  if (!kwnames && nargs >= e.frontMin && nargs <= e.frontMax) {
    static PyObject* const zero = PyLong_FromLong(0);  // made once with the GIL held; kept
    PyObject* filled[3] = {nullptr, nullptr, nullptr};
    for (Py_ssize_t i = 0; i < nargs; ++i) filled[i] = args[i];
    if (nargs < e.nargs) filled[e.nargs - 1] = zero;
    OpArgs a;
    if (zero && e.fill(*b->comm, filled, &a)) {
      if (!submitBlocking(*b->comm, a)) return nullptr;
      Py_RETURN_NONE;
    }
  }
  return callGeneral(PyTuple_GET_ITEM(self, 1), PyTuple_GET_ITEM(self, 2), args, nargs, kwnames);
}

// One method definition per entry (its __name__), for each kind; they must outlive every
// function made from them.
PyMethodDef* methodDef(size_t i, bool front) {
  static PyMethodDef entries[kFastCount], fronts[kFastCount];
  static const bool made = [] {
    for (size_t k = 0; k < kFastCount; ++k) {
      entries[k] = PyMethodDef{kFastEntries[k].op, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fastRun)),
                               METH_FASTCALL, "A blocking op of this communicator on numpy arrays, without pybind11's "
                                              "dispatch: True when it ran, False when the general path must."};
      fronts[k] = PyMethodDef{kFastEntries[k].op, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&frontRun)),
                              METH_FASTCALL | METH_KEYWORDS,
                              "hetobs.Communicator's method of this name (see help(hetobs.Communicator)), its "
                              "commonest call run in C."};
    }
    return true;
  }();
  (void)made;
  return front ? &fronts[i] : &entries[i];
}

size_t indexOf(const FastEntry& e) { return size_t(&e - kFastEntries); }

}  // namespace

py::object fastEntry(std::shared_ptr<Communicator> c, const std::string& op) {
  const FastEntry& e = entryFor(op, "fast_entry");
  PyObject* cap = newCapsule(std::move(c), e);
  PyObject* f = PyCFunction_New(methodDef(indexOf(e), false), cap);
  Py_DECREF(cap);  // the function holds it
  if (!f) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(f);
}

py::object fastFront(std::shared_ptr<Communicator> c, const std::string& op, py::object method, py::object owner) {
  const FastEntry& e = entryFor(op, "fast_front");
  if (!PyCallable_Check(method.ptr())) throw py::type_error("fast_front: method must be callable");
  py::object cap = py::reinterpret_steal<py::object>(newCapsule(std::move(c), e));
  py::object ref = py::reinterpret_steal<py::object>(PyWeakref_NewRef(owner.ptr(), nullptr));
  if (!ref) throw py::error_already_set();
  py::tuple self = py::make_tuple(cap, method, ref);
  PyObject* f = PyCFunction_New(methodDef(indexOf(e), true), self.ptr());
  if (!f) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(f);
}

}  // namespace bindings
}  // namespace hetobs
