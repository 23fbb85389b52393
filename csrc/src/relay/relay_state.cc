#include "hetobs/relay/relay_state.h"

#include "hetobs/common/error.h"
#include "hetobs/common/log.h"

namespace hetobs {

const char* relayStageName(RelayStage s) {
  switch (s) {
    case RelayStage::kNone:
      return "none";
    case RelayStage::kHost:
      return "host";
    case RelayStage::kCuda:
      return "cuda";
    case RelayStage::kDevice:
      return "device";
  }
  return "invalid";
}

uint8_t* StagingBuffer::ensure(CopyLane& lane, size_t bytes) {
  if (p_ && n_ >= bytes && lane_ == &lane) return p_;
  release();
  p_ = lane.allocStaging(bytes);
  n_ = bytes;
  lane_ = &lane;
  return p_;
}

void StagingBuffer::release() {
  if (p_) lane_->freeStaging(p_);
  p_ = nullptr;
  n_ = 0;
}

void drainAfterFailure(StagedPath& path) {
  for (CopyLane* lane : {path.in.get(), path.out.get()}) {
    try {
      if (lane) lane->drain();
    } catch (const std::exception& e) {
      HETOBS_WARN("relay: a copy lane failed to drain after the op failed: %s", e.what());
    }
  }
}

RelayState::RelayState(int commSize, std::function<void()> wake)
    : wake_(std::move(wake)), peers_(size_t(commSize)) {}

RelayState::~RelayState() = default;

StagedPath& RelayState::path(const RelayRequest& r) {
  auto wake = [this] {
    bell_.ring();
    if (wake_) wake_();
  };
  if (r.stage == RelayStage::kHost) {
    if (!host_) {
      auto p = std::make_unique<StagedPath>();
      p->in = makeHostCopyLane(wake);
      p->out = makeHostCopyLane(wake);
      host_ = std::move(p);
    }
    return *host_;
  }
  HETOBS_ENFORCE(r.stage == RelayStage::kCuda || r.stage == RelayStage::kDevice, "relay stage %d has no staging",
                 int(r.stage));
  int type = r.stage == RelayStage::kCuda ? -1 : r.device_type;
  if (!device_ || deviceStage_ != r.stage || deviceType_ != type || deviceIndex_ != r.device) {
    device_.reset();  // one device's lanes at a time: a job's island has one device
    auto p = std::make_unique<StagedPath>();
    if (r.stage == RelayStage::kCuda) {
      p->in = makeCudaCopyLane(r.device);
      p->out = makeCudaCopyLane(r.device);
    } else {
      p->in = makeDeviceCopyLane(type, r.device, false, wake);
      p->out = makeDeviceCopyLane(type, r.device, true, wake);
    }
    device_ = std::move(p);
    deviceStage_ = r.stage;
    deviceType_ = type;
    deviceIndex_ = r.device;
  }
  return *device_;
}

}  // namespace hetobs
