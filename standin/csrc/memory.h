#pragma once
#include <c10/core/Allocator.h>

namespace standin {

// Install the device allocator and the PrivateUse1 hooks (idempotent).
void registerMemory();
// Pinned host memory: copies between it and the device may be asynchronous.
c10::Allocator* pinnedAllocator();

}  // namespace standin
