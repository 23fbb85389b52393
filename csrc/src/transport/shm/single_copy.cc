#include "hetobs/transport/shm/single_copy.h"

#include <sys/uio.h>

#include <cerrno>

#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"

namespace hetobs {
namespace shm {

const uint64_t* probeWord() {
  // Random, so a process that happens to hold the owner's pid in another pid namespace
  // (containers sharing /dev/shm) does not read back the same value.
  static const uint64_t word = [] {
    uint64_t v = 0;
    while (v == 0) randomBytes(&v, sizeof v);
    return v;
  }();
  return &word;
}

namespace {

// process_vm_readv or _writev until all `len` bytes moved; 0 or the errno.
template <class Move>
int movePeer(uint8_t* local, uint64_t addr, size_t len, Move move) {
  while (len > 0) {
    iovec here{local, len};
    iovec there{reinterpret_cast<void*>(addr), len};
    ssize_t n = move(&here, &there);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;  // nothing there where the peer said its buffer is
    local += n;
    addr += uint64_t(n);
    len -= size_t(n);
  }
  return 0;
}

}  // namespace

int readPeer(int pid, uint64_t addr, void* dst, size_t len) {
  return movePeer(static_cast<uint8_t*>(dst), addr, len, [pid](iovec* here, iovec* there) {
    return process_vm_readv(pid_t(pid), here, 1, there, 1, 0);
  });
}

int writePeer(int pid, uint64_t addr, const void* src, size_t len) {
  // process_vm_writev only reads the local iovec's memory.
  return movePeer(const_cast<uint8_t*>(static_cast<const uint8_t*>(src)), addr, len,
                  [pid](iovec* here, iovec* there) { return process_vm_writev(pid_t(pid), here, 1, there, 1, 0); });
}

bool canReadPeer(int pid, uint64_t probeAddr, uint64_t probeValue, std::string* why) {
  uint64_t got = 0;
  int err = readPeer(pid, probeAddr, &got, sizeof got);
  if (err != 0) {
    *why = strFormat("process_vm_readv of pid %d failed: %s", pid, errnoString(err).c_str());
    return false;
  }
  if (got != probeValue) {
    *why = strFormat("pid %d is not the peer (another pid namespace?)", pid);
    return false;
  }
  return true;
}

}  // namespace shm
}  // namespace hetobs
