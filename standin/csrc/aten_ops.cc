// The stand-in's kernels: allocation, views, copies (the only kernels that touch device
// memory and the copy engines), and a boxed fallback that runs every other op on the CPU
// (inputs copied to the host, the CPU kernel, outputs copied back: each copy is a device
// copy, paced and ordered like any other).
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "runtime.h"

namespace standin {
namespace {

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

// A host tensor's bytes, not owning them.
at::Tensor view(const at::Tensor& host) {
  return at::from_blob(host.data_ptr(), host.sizes(), host.strides(), host.options());
}

// The same bytes seen as a CPU tensor (device kernels and copy engines only).
at::Tensor hostView(const at::Tensor& t) {
  return at::from_blob(untag(t.data_ptr()), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin, std::optional<c10::MemoryFormat> mf) {
  const auto d = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "standin: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin), "standin: only CPU tensors can be pinned");
  c10::DeviceGuard guard(d);
  return at::detail::empty_generic(size, c10::GetAllocator(c10::DeviceType::PrivateUse1), kKeys,
                                   c10::dtype_or_default(dtype), mf);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin) {
  const auto d = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "standin: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin), "standin: only CPU tensors can be pinned");
  c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, c10::GetAllocator(c10::DeviceType::PrivateUse1), kKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> offset) {
  std::optional<int64_t> off;
  if (offset) off = offset->expect_int();
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), off);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<at::MemoryFormat> mf) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), mf);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor view_kernel(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

// Every copy with a stand-in device on either side comes here (copy_, .to(), the fallback).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.numel() == 0) return dst;
  const bool srcDev = self.is_privateuseone(), dstDev = dst.is_privateuseone();
  if (srcDev && dstDev) {  // on the device (or between two): after both streams' work, on this thread
    currentStream(self.device().index())->synchronize();
    if (dst.device() != self.device()) currentStream(dst.device().index())->synchronize();
    at::Tensor out = hostView(dst);
    at::native::copy_(out, hostView(self), false);
    return dst;
  }
  const int device = srcDev ? self.device().index() : dst.device().index();
  const at::Tensor& host = srcDev ? dst : self;
  TORCH_CHECK(host.is_cpu(), "standin: copies between a standin device and ", host.device(), " are not supported");
  // Asynchronous only from or to pinned memory, as with a real driver (pageable memory
  // is staged by the driver: the host waits).
  const bool async = non_blocking && isPinned(host.data_ptr());
  Stream* s = currentStream(device);
  // Views without ownership: the worker must never drop the last reference of a tensor
  // Python still knows (that takes the GIL, and at exit kills the thread). The memory
  // outlives the copy anyway: device and pinned blocks are freed only once the streams
  // passed the work issued before the free (runtime.h), and pageable copies are waited for.
  at::Tensor from = srcDev ? hostView(self) : view(self), to = dstDev ? hostView(dst) : view(dst);
  auto fn = [from, to]() mutable { at::native::copy_(to, from, false); };
  size_t bytes = size_t(dst.numel()) * dst.element_size();
  uint64_t seq = s->enqueue(std::move(fn), &engine(device, srcDev ? Direction::kD2H : Direction::kH2D), bytes);
  if (!async) waitFor(s, seq);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  currentStream(self.device().index())->synchronize();
  return at::native::_local_scalar_dense_cpu(hostView(self));
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) { return at::native::set_(self, source); }
at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }
at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                               c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, source, offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { at::native::cpu_fallback(op, stack); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize_);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("view", view_kernel);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

}  // namespace standin
