#pragma once
#include <sched.h>
// Two ranks' shared-memory channels in one process, over two real segments, for the native
// tests of the shared-memory transport (shm_mail_test.cc, shm_push_test.cc).
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "hetobs/transport/shm/channel.h"
#include "hetobs/transport/shm/segment.h"
#include "hetobs/common/clock.h"
#include "native_test.h"

namespace shm_link {

using hetobs::OpDesc;
using hetobs::RecvItem;
using hetobs::SendItem;
using hetobs::shm::Segment;
using hetobs::shm::ShmChannel;

inline constexpr uint64_t kRingBytes = 64 * 1024;
inline constexpr uint64_t kRingFrameOf8Bytes = 128;  // a 64 B header and the payload rounded to 64

// Two ranks' segments and each rank's channel to the other (0 sends on `a`, 1 on `b`).
struct Link {
  std::unique_ptr<Segment> seg0, seg1;
  std::unique_ptr<ShmChannel> a, b;

  explicit Link(const std::string& tag) {
    std::string n0 = "/hetobs-test-shm-" + tag + "-0-" + std::to_string(getpid());
    std::string n1 = "/hetobs-test-shm-" + tag + "-1-" + std::to_string(getpid());
    seg0 = Segment::create(n0, 1, kRingBytes);
    seg1 = Segment::create(n1, 1, kRingBytes);
    std::shared_ptr<Segment> seg0seen = Segment::open(n0), seg1seen = Segment::open(n1);
    seg0->unlink();
    seg1->unlink();
    int fds[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0, "socketpair");
    hetobs::PeerInfo p0, p1;
    p0.rank = p0.global_rank = 0;
    p1.rank = p1.global_rank = 1;
    p0.pid = p1.pid = getpid();
    a = std::make_unique<ShmChannel>(p1, fds[0], seg0.get(), seg1seen, 0, 0);
    b = std::make_unique<ShmChannel>(p0, fds[1], seg1.get(), seg0seen, 0, 0);
  }
  uint64_t ringHeadInto1() const { return seg1->ring(0)->head.load(); }
};

inline OpDesc descOf(uint64_t seq, uint64_t count) {
  OpDesc d;
  d.comm_tag = 7;
  d.op = hetobs::OpKind::kAllReduce;
  d.seq = seq;
  d.count = count;
  return d;
}

// mayPush / pushAll / alsoCopyTo as SendItem's; returns the item's alsoCopied.
// How long a step may wait for the other thread: by time, not by a count of polls (a count
// is a few milliseconds in an optimised build, less than one descheduling on a loaded machine),
// yielding between polls so the peer thread gets the core on two cores.
struct Patience {
  int64_t until = hetobs::systemMonoNs() + 30'000'000'000;
  bool more() {
    sched_yield();
    return hetobs::systemMonoNs() < until;
  }
};

inline size_t sendAll(ShmChannel& ch, const void* data, size_t len, const OpDesc& d, bool mayPush = false,
                      bool pushAll = false, uint8_t* alsoCopyTo = nullptr) {
  SendItem s;
  s.mayPush = mayPush;
  s.pushAll = pushAll;
  s.alsoCopyTo = alsoCopyTo;
  s.peer = 1;
  s.data = static_cast<const uint8_t*>(data);
  s.len = len;
  for (Patience p; !ch.progressSend(s, d);) CHECK(p.more(), "a send never finished");
  return s.alsoCopied;
}

inline void recvAll(ShmChannel& ch, void* dst, size_t len, const OpDesc& d, const float* local = nullptr) {
  RecvItem r;
  r.peer = 0;
  r.dst = static_cast<uint8_t*>(dst);
  r.len = len;
  if (local) {
    r.mode = hetobs::RecvMode::kReduce;
    r.local = reinterpret_cast<const uint8_t*>(local);
    r.dtype = hetobs::DType::kFloat32;
  }
  for (Patience p; !ch.progressRecv(r, d);) CHECK(p.more(), "a receive never finished");
}

}  // namespace shm_link
