// The record ring wraps many times while ops are in flight: no record is ever torn (half
// one op, half another), an op in flight keeps its record, and a late update of a finished
// record changes nothing.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "hetobs/record/recorder.h"
#include "native_test.h"

using hetobs::OpRecord;
using hetobs::OpState;
using hetobs::Recorder;

namespace {

// Every field a writer sets carries its token, so a record mixing two writers shows.
OpRecord recordFor(uint64_t token) {
  OpRecord r{};
  r.comm_id = token;
  r.count = token;
  r.bytes = token;
  r.t_enqueue_ns = int64_t(token);
  r.t_start_ns = int64_t(token);
  r.comm_size = 2;
  r.state = uint8_t(OpState::kStarted);
  return r;
}

bool consistent(const OpRecord& r) {
  uint64_t t = r.comm_id;
  if (r.count != t || r.bytes != t || r.t_enqueue_ns != int64_t(t) || r.t_start_ns != int64_t(t)) return false;
  if (r.state == uint8_t(OpState::kCompleted)) return r.t_end_ns == int64_t(t) + 1 && r.error[0] == 0;
  return r.state == uint8_t(OpState::kStarted) && r.t_end_ns == 0;
}

}  // namespace

NATIVE_TEST(recorder_ring_wrap_never_tears_a_record) {
  Recorder& rec = Recorder::instance();
  rec.configure(4);  // tiny ring: concurrent writers land on the same slots all the time
  constexpr uint64_t kLong = 1ULL << 60;
  uint64_t longId = rec.begin(recordFor(kLong));  // in flight throughout: its slot is never taken
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> torn{0}, seen{0};
  std::vector<std::thread> threads;
  constexpr int kWriters = 3;
  constexpr uint64_t kOps = 60000;
  for (int w = 0; w < kWriters; ++w)
    threads.emplace_back([&, w] {
      for (uint64_t i = 0; i < kOps; ++i) {
        uint64_t token = (uint64_t(w + 1) << 40) + i * 2;
        uint64_t id = rec.begin(recordFor(token));
        rec.markFinished(id, int64_t(token) + 1, true, nullptr);
        // Late updates of a finished record hit it or whatever record holds its slot now, maybe
        // while another writer's begin() fills it: they must change nothing.
        if (i % 4 == 0) {
          rec.markFinished(id, 7, false, "late update of a finished record");
          rec.markStarted(id, 9);
        }
      }
    });
  threads.emplace_back([&] {
    while (!stop.load()) {
      for (const OpRecord& r : rec.snapshot()) {
        seen.fetch_add(1);
        if (!consistent(r)) torn.fetch_add(1);
      }
    }
  });
  for (int w = 0; w < kWriters; ++w) threads[size_t(w)].join();
  stop.store(true);
  threads.back().join();
  for (const OpRecord& r : rec.snapshot()) CHECK(consistent(r), "record " + std::to_string(r.record_id) + " is torn");
  CHECK(seen.load() > 0, "the reader saw records");
  CHECK(torn.load() == 0, std::to_string(torn.load()) + " of " + std::to_string(seen.load()) +
                              " records read were torn");
  OpRecord longRec{};
  CHECK(rec.get(longId, &longRec) && consistent(longRec) && longRec.state == uint8_t(OpState::kStarted),
        "the op in flight kept its record through " + std::to_string(kWriters * kOps) + " ops on a ring of 4");
  rec.markFinished(longId, int64_t(kLong) + 1, true, nullptr);
  CHECK(rec.get(longId, &longRec) && consistent(longRec) && longRec.state == uint8_t(OpState::kCompleted),
        "its owner's markFinished landed");
  CHECK(rec.nextId() >= longId + 1 + kWriters * kOps, "every begin() claimed an id of its own");
  rec.configure(2048);
}

// Every slot holds an op in flight: a new op goes unrecorded (its begin() neither waits nor
// takes a slot), updates of it change nothing, and the first slot freed is used again.
NATIVE_TEST(recorder_ring_all_in_flight_drops_the_new_record) {
  Recorder& rec = Recorder::instance();
  rec.configure(4);
  uint64_t held[4];
  for (int i = 0; i < 4; ++i) held[i] = rec.begin(recordFor(100 + uint64_t(i)));
  uint64_t dropped = rec.begin(recordFor(200));
  OpRecord r{};
  CHECK(!rec.get(dropped, &r), "an op with no free slot has no record");
  rec.markStarted(dropped, 5);
  rec.markFinished(dropped, 6, false, "update of an unrecorded op");
  for (int i = 0; i < 4; ++i)
    CHECK(rec.get(held[i], &r) && r.comm_id == 100 + uint64_t(i) && consistent(r) &&
              r.state == uint8_t(OpState::kStarted),
          "in-flight record " + std::to_string(i) + " is untouched");
  rec.markFinished(held[2], int64_t(102) + 1, true, nullptr);
  uint64_t next = rec.begin(recordFor(300));
  CHECK(rec.get(next, &r) && r.comm_id == 300 && consistent(r), "the freed slot took the next op");
  CHECK(rec.get(held[2], &r) == false, "the finished op's record was the one replaced");
  for (int i : {0, 1, 3}) CHECK(rec.get(held[i], &r) && r.comm_id == 100 + uint64_t(i), "the others stay");
  rec.configure(2048);
}
