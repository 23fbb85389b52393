// Shared-memory single copy (transport/shm/single_copy.h) between two real processes: a
// forked child reads its parent's probe word and a buffer the parent rewrote after the fork
// (so the bytes can only have come from the parent's memory), and is refused cleanly where
// the probe does not match or the address is not mapped.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "hetobs/transport/shm/segment.h"
#include "hetobs/transport/shm/single_copy.h"
#include "native_test.h"

namespace {

using hetobs::shm::SegmentHeader;

// What the child found, one byte per check (1 = as expected), sent back over a pipe.
enum : size_t { kProbeOk, kDataOk, kWrongValueRefused, kUnmappedRefused, kChecks };

void childChecks(const SegmentHeader& parent, const uint8_t* buf, size_t len, uint8_t expect, int out) {
  uint8_t got[kChecks] = {};
  std::string why;
  got[kProbeOk] = hetobs::shm::canReadPeer(parent.owner_pid, parent.probe_addr, parent.probe_value, &why);
  std::vector<uint8_t> copy(len);
  got[kDataOk] = hetobs::shm::readPeer(parent.owner_pid, reinterpret_cast<uint64_t>(buf), copy.data(), len) == 0 &&
                 copy[0] == expect && copy[len - 1] == expect;
  // another process at that pid (another pid namespace) holds another value there
  got[kWrongValueRefused] = !hetobs::shm::canReadPeer(parent.owner_pid, parent.probe_addr, parent.probe_value ^ 1, &why) &&
                            why.find("not the peer") != std::string::npos;
  got[kUnmappedRefused] = hetobs::shm::readPeer(parent.owner_pid, 4096, copy.data(), 64) == EFAULT;
  (void)!write(out, got, sizeof got);
}

}  // namespace

NATIVE_TEST(single_copy_reads_the_parents_rewritten_buffer_and_refuses_a_stranger) {
  std::string name = "/hetobs-test-single-copy-" + std::to_string(getpid());
  auto seg = hetobs::shm::Segment::create(name, 1, 4096);
  seg->unlink();
  const size_t len = 256 * 1024;
  std::vector<uint8_t> buf(len, 1);
  int go[2], back[2];
  CHECK(pipe(go) == 0 && pipe(back) == 0, "pipes");
  pid_t child = fork();
  if (child == 0) {
    char c;
    (void)!read(go[0], &c, 1);  // the parent has rewritten buf
    childChecks(*seg->header(), buf.data(), len, 7, back[1]);
    _exit(0);
  }
  memset(buf.data(), 7, len);  // after the fork: the child's own copy still holds 1s
  (void)!write(go[1], "x", 1);
  uint8_t got[kChecks] = {};
  ssize_t n = read(back[0], got, sizeof got);
  int status = 0;
  waitpid(child, &status, 0);
  for (int fd : {go[0], go[1], back[0], back[1]}) close(fd);
  CHECK(n == ssize_t(sizeof got), "child reported " + std::to_string(n) + " bytes");
  CHECK(got[kProbeOk], "the child could not read the parent's probe word");
  CHECK(got[kDataOk], "the child did not read the parent's rewritten buffer");
  CHECK(got[kWrongValueRefused], "a probe value that does not match was accepted");
  CHECK(got[kUnmappedRefused], "an unmapped address did not fail with EFAULT");
}
