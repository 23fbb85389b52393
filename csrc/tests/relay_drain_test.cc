// A relay that fails must leave no copy running into the caller's buffers: both directions
// are drained, each on its own, even when one lane's drain fails (relay_state.h).
#include <stdexcept>

#include "hetobs/relay/relay_state.h"
#include "native_test.h"

namespace {

class FakeLane final : public hetobs::CopyLane {
 public:
  FakeLane(bool failDrain, int* drained) : failDrain_(failDrain), drained_(drained) {}
  uint64_t post(void*, const void*, size_t) override { return ++posted_; }
  uint64_t completed() override { return done_; }
  void waitFor(uint64_t, int64_t) override {}
  void drain() override {
    ++*drained_;
    if (failDrain_) throw std::runtime_error("device lost");
    done_ = posted_;
  }
  int64_t busyNs() override { return 0; }
  uint8_t* allocStaging(size_t) override { return nullptr; }
  void freeStaging(uint8_t*) override {}

 private:
  bool failDrain_;
  int* drained_;
  uint64_t posted_ = 0, done_ = 0;
};

}  // namespace

NATIVE_TEST(relay_failure_drains_the_other_direction_when_one_drain_fails) {
  for (bool inFails : {true, false}) {
    int drainedIn = 0, drainedOut = 0;
    hetobs::StagedPath path;
    path.in = std::make_unique<FakeLane>(inFails, &drainedIn);
    path.out = std::make_unique<FakeLane>(!inFails, &drainedOut);
    path.in->post(nullptr, nullptr, 1);
    path.out->post(nullptr, nullptr, 1);
    hetobs::drainAfterFailure(path);  // must not throw: the op's own error is what propagates
    CHECK(drainedIn == 1 && drainedOut == 1, "both lanes drained once, whichever failed");
    CHECK((inFails ? path.out : path.in)->completed() == 1, "the healthy lane finished its copy");
  }
}
