// The stand-in's DeviceGuardImpl: what torch's device-generic code (torch.Stream,
// torch.Event, torch.accelerator, c10::DeviceGuard, autograd's device threads) calls for
// PrivateUse1. Stream ids are 0 (default) and 1..kPoolStreams (the pool).
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "runtime.h"

namespace standin {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

// A device without an index ("standin") means the current one.
int indexOf(c10::Device d) { return d.has_index() ? d.index() : currentDevice(); }

Stream* streamOf(const c10::Stream& s) { return stream(indexOf(s.device()), int(s.id())); }

c10::Stream wrap(Stream* s) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, c10::DeviceIndex(s->device())), c10::StreamId(s->index()));
}

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (indexOf(d) != old.index()) setCurrentDevice(indexOf(d));
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, c10::DeviceIndex(currentDevice())); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "standin: not a standin device: ", d);
    setCurrentDevice(indexOf(d));
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      setCurrentDevice(indexOf(d));
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device d) const override { return wrap(currentStream(indexOf(d))); }
  c10::Stream getDefaultStream(c10::Device d) const override { return wrap(stream(indexOf(d), 0)); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return wrap(nextPoolStream(indexOf(d))); }
  c10::Stream getNewStream(c10::Device d, int) const override { return wrap(nextPoolStream(indexOf(d))); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    setCurrentStream(indexOf(s.device()), int(s.id()));
    return old;
  }

  c10::DeviceIndex deviceCount() const noexcept override { return c10::DeviceIndex(standin::deviceCount()); }

  void record(void** event, const c10::Stream& s, const c10::DeviceIndex, const c10::EventFlag) const override {
    auto* e = static_cast<Event*>(*event);
    if (!e) *event = e = new Event();
    Stream* st = streamOf(s);
    auto stamp = std::make_shared<std::atomic<int64_t>>(0);
    e->stream = st;
    e->stamp = stamp;
    e->seq = st->enqueue([stamp] { stamp->store(nowNs(), std::memory_order_relaxed); });
  }
  void block(void* event, const c10::Stream& s) const override {
    auto* e = static_cast<Event*>(event);
    if (e && e->stream) streamOf(s)->enqueueWait(e->stream, e->seq);
  }
  bool queryEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    return !e || !e->stream || e->stream->completed() >= e->seq;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete static_cast<Event*>(event); }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    if (e && e->stream) waitFor(e->stream, e->seq);
  }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    auto *ea = static_cast<Event*>(a), *eb = static_cast<Event*>(b);
    TORCH_CHECK(ea && eb && ea->stream && eb->stream, "standin: elapsed_time needs two recorded events");
    waitFor(ea->stream, ea->seq);
    waitFor(eb->stream, eb->seq);
    return double(eb->stamp->load() - ea->stamp->load()) / 1e6;  // ms, as torch reports it
  }

  bool queryStream(const c10::Stream& s) const override {
    Stream* st = streamOf(s);
    return st->completed() >= st->issued();
  }
  void synchronizeStream(const c10::Stream& s) const override { streamOf(s)->synchronize(); }
  void synchronizeDevice(const c10::DeviceIndex d) const override { standin::synchronizeDevice(d); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace
}  // namespace standin
