// Allocators and the PrivateUse1 hooks: device memory (tagged addresses), pinned host
// memory (what makes a host<->device copy asynchronous), and what torch asks a backend
// about itself (torch.accelerator, is_pinned, pin_memory).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "memory.h"
#include "runtime.h"

namespace standin {
namespace {

void freeDevice(void* p) { deviceFree(p); }
void freePinned(void* p) { pinnedFree(p); }

struct DeviceAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    int d = currentDevice();
    void* p = n ? deviceAlloc(d, n) : nullptr;
    return {p, p, &freeDevice, c10::Device(c10::DeviceType::PrivateUse1, c10::DeviceIndex(d))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &freeDevice; }
  // Storage resizes copy device to device: both sides are device addresses.
  void copy_data(void* dst, const void* src, size_t n) const override {
    if (n) std::memcpy(untag(dst), untag(src), n);
  }
};

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = pinnedAlloc(n);
    return {p, p, &freePinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &freePinned; }
  void copy_data(void* dst, const void* src, size_t n) const override { std::memcpy(dst, src, n); }
};

DeviceAllocator g_device_allocator;
PinnedAllocator g_pinned_allocator;

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return deviceCount() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return c10::DeviceIndex(standin::deviceCount()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { standin::setCurrentDevice(d); }
  c10::DeviceIndex getCurrentDevice() const override { return c10::DeviceIndex(currentDevice()); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    int old = currentDevice();
    standin::setCurrentDevice(d);
    return c10::DeviceIndex(old);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  bool isPinnedPtr(const void* p) const override { return isPinned(p); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  c10::Device getDeviceFromPtr(void* p) const override {
    TORCH_CHECK(isDevicePtr(p), "standin: ", p, " is not a device address");
    return c10::Device(c10::DeviceType::PrivateUse1, c10::DeviceIndex(currentDevice()));
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    TORCH_CHECK(false, "standin: the stand-in device has no random number generator (make random tensors on the "
                       "CPU and copy them)");
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::DataPtr fresh = g_device_allocator.allocate(newsize);
    size_t keep = std::min(newsize, storage.nbytes());
    if (keep) g_device_allocator.copy_data(fresh.get(), storage.data(), keep);
    storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
    storage.unsafeGetStorageImpl()->set_nbytes(newsize);
  }
};

}  // namespace

void registerMemory() {
  static bool done = [] {
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_device_allocator);
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    return true;
  }();
  (void)done;
}

c10::Allocator* pinnedAllocator() { return &g_pinned_allocator; }

}  // namespace standin
