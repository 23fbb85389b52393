#include "hetobs/relay/relay_state.h"

#include "hetobs/common/error.h"

namespace hetobs {

const char* relayStageName(RelayStage s) {
  switch (s) {
    case RelayStage::kNone:
      return "none";
    case RelayStage::kHost:
      return "host";
    case RelayStage::kCuda:
      return "cuda";
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

RelayState::RelayState(int commSize, std::function<void()> wake)
    : wake_(std::move(wake)), peers_(size_t(commSize)) {}

RelayState::~RelayState() = default;

StagedPath& RelayState::path(RelayStage stage, int device) {
  if (stage == RelayStage::kHost) {
    if (!host_) {
      auto p = std::make_unique<StagedPath>();
      auto wake = [this] {
        bell_.ring();
        if (wake_) wake_();
      };
      p->in = makeHostCopyLane(wake);
      p->out = makeHostCopyLane(wake);
      host_ = std::move(p);
    }
    return *host_;
  }
  HETOBS_ENFORCE(stage == RelayStage::kCuda, "relay stage %d has no staging", int(stage));
  if (!cuda_ || cudaDevice_ != device) {
    cuda_.reset();
    auto p = std::make_unique<StagedPath>();
    p->in = makeCudaCopyLane(device);
    p->out = makeCudaCopyLane(device);
    cuda_ = std::move(p);
    cudaDevice_ = device;
  }
  return *cuda_;
}

}  // namespace hetobs
