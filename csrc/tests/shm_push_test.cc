// Shared-memory push (single_copy.h): a one-way message of kPushMinBytes or more from a send
// that may push arrives whole, its second half written by the sender into the receiver's
// buffer while the receiver reads the first; each end counts its part. Two threads, each one
// rank's end of a real link (process_vm_readv/_writev into this same process), so
// ThreadSanitizer sees the offer, the answer in the push slot and the frame that ends it.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hetobs/transport/shm/single_copy.h"
#include "shm_link.h"

using namespace shm_link;

NATIVE_TEST(shm_push_splits_a_one_way_message_between_sender_and_receiver) {
  Link link("push");
  const size_t sizes[] = {hetobs::shm::kPushMinBytes - 1, hetobs::shm::kPushMinBytes, (3u << 20) + 5,
                          hetobs::shm::kPushMinBytes + 64};
  uint64_t pushed = 0, arrived = 0, seq = 0;
  for (int round = 0; round < 3; ++round) {
    for (size_t len : sizes) {
      std::vector<uint8_t> src(len), dst(len, 0);
      for (size_t k = 0; k < len; ++k) src[k] = uint8_t(k * 131 + len + round);
      const OpDesc d = descOf(++seq, len);
      std::thread receiver([&] { recvAll(*link.b, dst.data(), len, d); });
      sendAll(*link.a, src.data(), len, d, /*mayPush=*/true);
      receiver.join();
      CHECK(dst == src, "a " + std::to_string(len) + " B message arrived changed");
      if (len >= hetobs::shm::kPushMinBytes) pushed += len - hetobs::shm::pushStart(len);
      arrived += len;
      CHECK(link.a->pushBytes() == pushed, "the sender pushed " + std::to_string(link.a->pushBytes()) +
                                               " bytes, expected " + std::to_string(pushed));
      CHECK(link.b->singleCopyBytes() == arrived, "one copy brought " + std::to_string(link.b->singleCopyBytes()) +
                                                      " bytes, expected " + std::to_string(arrived));
    }
  }
  CHECK(link.b->pushBytes() == 0 && link.a->singleCopyBytes() == 0, "the receiver pushed or the sender read");
}

NATIVE_TEST(shm_push_all_writes_the_whole_message_and_copies_it_locally_on_the_way) {
  Link link("pushall");
  const size_t len = (2u << 20) + 12;  // pieces of kPushPiece and a short last one
  std::vector<uint8_t> src(len), dst(len, 0), local(len, 0);
  for (size_t k = 0; k < len; ++k) src[k] = uint8_t(k * 7 + 3);
  const OpDesc d = descOf(1, len);
  std::thread receiver([&] { recvAll(*link.b, dst.data(), len, d); });
  size_t copied = sendAll(*link.a, src.data(), len, d, /*mayPush=*/true, /*pushAll=*/true, local.data());
  receiver.join();
  CHECK(dst == src && local == src, "the pushed message or its local copy arrived changed");
  CHECK(copied == len, "alsoCopied says " + std::to_string(copied));
  CHECK(link.a->pushBytes() == len && link.b->singleCopyBytes() == len,
        "pushed " + std::to_string(link.a->pushBytes()) + ", arrived in one copy " + std::to_string(link.b->singleCopyBytes()));
}
