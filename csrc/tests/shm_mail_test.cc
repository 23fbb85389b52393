// Shared-memory mail slots (segment.h): frames of at most kMailPayload bytes go through a
// slot of one cache line instead of the ring, and still arrive in order with every check a
// ring frame gets. Two real channels over two real segments, in one process: one thread
// where the order of sends and receives is the point, two for the slots' reuse under load
// (what ThreadSanitizer looks at).
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hetobs/common/error.h"
#include "shm_link.h"

using namespace shm_link;

NATIVE_TEST(shm_mail_slots_keep_frame_order_and_hand_over_to_the_ring_while_held) {
  Link link("order");
  // Ten 8 B messages before any is taken: the four slots take the first four, the ring the rest.
  for (uint64_t i = 0; i < 10; ++i) {
    float v[2] = {float(i), float(100 + i)};
    sendAll(*link.a, v, sizeof v, descOf(i, 2));
  }
  CHECK(link.ringHeadInto1() == 6 * kRingFrameOf8Bytes,
        "ring head " + std::to_string(link.ringHeadInto1()) + ", expected six ring frames");
  for (uint64_t i = 0; i < 10; ++i) {
    float got[2] = {-1, -1};
    recvAll(*link.b, got, sizeof got, descOf(i, 2));
    CHECK(got[0] == float(i) && got[1] == float(100 + i), "message " + std::to_string(i) + " out of order");
  }
  // Taken, the slots are free again: small messages no longer touch the ring.
  const uint64_t before = link.ringHeadInto1();
  const size_t sizes[] = {0, 4, 16, 17, 8, 4096, 12};
  uint64_t seq = 10;
  for (size_t len : sizes) {
    std::vector<uint8_t> out(len), in(len, 0xee);
    for (size_t k = 0; k < len; ++k) out[k] = uint8_t(seq * 31 + k);
    sendAll(*link.a, out.data(), len, descOf(seq, len));
    recvAll(*link.b, in.data(), len, descOf(seq, len));
    CHECK(in == out, "a " + std::to_string(len) + " B message arrived changed");
    ++seq;
  }
  const uint64_t ringBytes = link.ringHeadInto1() - before;
  // The mail payload is the header's aux word (8 B): the 16, 17 and 12 B messages take the ring too.
  CHECK(ringBytes == 3 * (64 + 64) + 64 + 4096, "the 12-17 B and 4 KiB messages alone take the ring, it moved " +
                                                    std::to_string(ringBytes) + " bytes");
  // A reduction folds a slot's payload like a ring frame's.
  float x[2] = {1.5f, -2.0f}, local[2] = {10.0f, 20.0f}, sum[2] = {0, 0};
  sendAll(*link.a, x, sizeof x, descOf(seq, 2));
  recvAll(*link.b, sum, sizeof sum, descOf(seq, 2), local);
  CHECK(sum[0] == 11.5f && sum[1] == 18.0f, "the slot's payload was not folded into the local values");
  ++seq;
  // The op in a slot's frame is checked: a rank at another seq is a mismatch, not data.
  sendAll(*link.a, x, sizeof x, descOf(seq, 2));
  bool mismatch = false;
  try {
    recvAll(*link.b, sum, sizeof sum, descOf(seq + 1, 2));
  } catch (const hetobs::MismatchError&) {
    mismatch = true;
  }
  CHECK(mismatch, "a slot frame of another op was taken as this op's data");
}

NATIVE_TEST(shm_mail_slots_are_reused_without_loss_between_two_threads) {
  Link ab("pingpong"), ba("pongping");  // rank 0 -> 1 on ab, rank 1 -> 0 on ba
  constexpr uint64_t kRounds = 20000;
  // Like an 8 B all_reduce: each side sends its value, then folds the other's in.
  auto side = [](ShmChannel& out, ShmChannel& in, float base, float* lastSum) {
    for (uint64_t i = 0; i < kRounds; ++i) {
      float mine[2] = {base + float(i), 1.0f}, sum[2] = {0, 0};
      sendAll(out, mine, sizeof mine, descOf(i, 2));
      recvAll(in, sum, sizeof sum, descOf(i, 2), mine);
      if (i + 1 == kRounds) memcpy(lastSum, sum, sizeof sum);
    }
  };
  float sum0[2] = {0, 0}, sum1[2] = {0, 0};
  std::thread t1([&] { side(*ba.a, *ab.b, 1000.0f, sum1); });
  side(*ab.a, *ba.b, 0.0f, sum0);
  t1.join();
  const float want = 1000.0f + 2.0f * float(kRounds - 1);
  CHECK(sum0[0] == want && sum1[0] == want && sum0[1] == 2.0f && sum1[1] == 2.0f,
        "the last round's sums are " + std::to_string(sum0[0]) + " and " + std::to_string(sum1[0]));
}
