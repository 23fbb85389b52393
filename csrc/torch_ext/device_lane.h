#pragma once
// The relay's copy lane for any torch device (stage 'device'): the table the core calls
// (hetobs/relay/device_lane_hooks.h), implemented with torch's device-generic API.
#include "hetobs/relay/device_lane_hooks.h"

namespace hetobs::torch_ext {

const DeviceLaneHooks* deviceLaneHooks();

}  // namespace hetobs::torch_ext
