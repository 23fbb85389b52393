// The TCP receive path fed hostile headers straight from a socket pair: every one must end
// in a PeerError or MismatchError naming the peer, never a write past a buffer (which
// AddressSanitizer reports) or a frame taken as data.
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <thread>
#include <string>
#include <vector>

#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/net.h"
#include "hetobs/transport/tcp/channel.h"
#include "native_test.h"

using namespace hetobs;

namespace {

constexpr size_t kElems = 1 << 20;        // float32: a 4 MiB op, 2 MiB received here
constexpr size_t kItemBytes = kElems / 2 * 4;

OpDesc op() {
  OpDesc d;
  d.op = OpKind::kAllReduce;
  d.dtype = DType::kFloat32;
  d.redop = RedOp::kSum;
  d.seq = 1;
  d.count = kElems;
  return d;
}

FrameHeader header(uint64_t bytes, uint64_t chunk = 0, uint8_t kind = uint8_t(FrameKind::kData)) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.kind = kind;
  h.setDesc(op());
  h.chunk = chunk;
  h.bytes = bytes;
  return h;
}

std::string bytesOf(const FrameHeader& h, size_t payload = 0) {
  std::string s(reinterpret_cast<const char*>(&h), sizeof h);
  s.append(payload, '\0');
  return s;
}

// Feed `wire` to a channel receiving one reduce item; what it threw ("" if it took the data).
std::string receive(const std::string& wire, bool closeAfter) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw Error("socketpair failed");
  int big = 8 << 20;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  tcp::TcpChannel ch(PeerInfo{1, 1, "fuzzer", 42}, sv[0]);
  std::vector<float> dst(kItemBytes / 4, 1.0f), local(kItemBytes / 4, 1.0f);
  RecvItem item;
  item.peer = 1;
  item.dst = reinterpret_cast<uint8_t*>(dst.data());
  item.local = reinterpret_cast<const uint8_t*>(local.data());
  item.len = kItemBytes;
  item.mode = RecvMode::kReduce;
  item.dtype = DType::kFloat32;
  std::string what;
  std::thread writer([&] {
    try {
      setNonBlocking(sv[1], false);
      writeFull(sv[1], wire.data(), wire.size(), monoNs() + 5000000000LL, "fuzz");
    } catch (const Error&) {
    }
    if (closeAfter) shutdown(sv[1], SHUT_WR);
  });
  int64_t until = monoNs() + 5000000000LL;
  try {
    while (!ch.progressRecv(item, op()) && monoNs() < until) {
    }
    what = monoNs() < until ? "" : "(no verdict within 5 s)";
  } catch (const PeerError& e) {
    what = std::string("PeerError: ") + e.what();
  } catch (const MismatchError& e) {
    what = std::string("MismatchError: ") + e.what();
  }
  shutdown(sv[1], SHUT_RDWR);  // a writer still blocked on a full socket gives up
  writer.join();
  ::close(sv[1]);
  return what;
}

}  // namespace

NATIVE_TEST(tcp_receive_rejects_hostile_frames) {
  struct Case {
    const char* name;
    std::string wire;
    bool close;
  };
  std::mt19937_64 rng(13);
  std::string noise(64 * 5, '\0');
  for (char& c : noise) c = char(rng());
  const Case cases[] = {
      {"past the staging buffer", bytesOf(header(kItemBytes), kItemBytes), false},
      {"negative length", bytesOf(header(~0ULL)), false},
      {"empty frame", bytesOf(header(0)), false},
      {"chunk out of order", bytesOf(header(4096, 7), 4096), false},
      {"misaligned payload", bytesOf(header(4098), 4098), false},
      {"ack of unsent frames", bytesOf(header(0, 1ULL << 40, uint8_t(FrameKind::kAck))), false},
      {"unknown kind", bytesOf(header(64, 0, 9), 64), false},
      {"truncated header", bytesOf(header(4096)).substr(0, 37), true},
      {"random bytes", noise, true},
  };
  for (const Case& c : cases) {
    std::string what = receive(c.wire, c.close);
    bool named = what.find("rank 1") != std::string::npos;
    bool clean = what.rfind("PeerError: ", 0) == 0 || what.rfind("MismatchError: ", 0) == 0;
    CHECK(clean && named, std::string(c.name) + ": " + (what.empty() ? "taken as data" : what));
  }
}
