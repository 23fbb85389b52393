#include "hetobs/common/asymmetric_fence.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace hetobs {
namespace {

long membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

bool registerOnce() {
  long supported = membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || !(supported & MEMBARRIER_CMD_GLOBAL_EXPEDITED) ||
      !(supported & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED))
    return false;
  return membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
}

}  // namespace

bool asymmetricFencesAvailable() {
  static const bool available = registerOnce();
  return available;
}

void heavyFence() {
  // GLOBAL_EXPEDITED needs no registration of the caller and, once QUERY listed it, does not
  // fail; should it, the full fence still orders this side and the sleep's timeout bounds a
  // wake-up lost on the other.
  if (!asymmetricFencesAvailable() || membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0)
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace hetobs
