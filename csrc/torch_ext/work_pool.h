#pragma once
// Memory for the Works the wrapper hands to torch, one per op: fixed blocks taken and given
// back through a lock-free free list (common/index_stack.h), so an op allocates nothing.
// When more Works are alive than there are blocks (a caller holding thousands of
// unwaited Works), the rest come from the heap.
#include <cstddef>
#include <new>

#include "hetobs/common/index_stack.h"

namespace hetobs::torch_ext {

template <size_t kSize, uint32_t kBlocks>
class BlockPool {
 public:
  void* allocate() {
    uint32_t i = free_.pop();
    if (i == IndexStack<kBlocks>::kNone) return ::operator new(kSize);
    return blocks_[i].bytes;
  }
  void release(void* p) noexcept {
    auto* b = static_cast<Block*>(p);
    if (b >= blocks_ && b < blocks_ + kBlocks) free_.push(uint32_t(b - blocks_));
    else ::operator delete(p);
  }

 private:
  struct Block {
    alignas(std::max_align_t) unsigned char bytes[kSize];
  };
  Block blocks_[kBlocks];
  IndexStack<kBlocks> free_;
};

}  // namespace hetobs::torch_ext
