// What a communicator says about itself in dumps and in the rank's metadata file
// (docs/dump-schema.md). Runs on the watchdog or an erroring op thread; reads only
// atomics, the record ring and fields fixed after connect().
#include "hetobs/comm/communicator.h"
#include "hetobs/observe/state_json.h"
#include "hetobs/record/recorder.h"

namespace hetobs {

void Communicator::writeMetadata(JsonWriter& w) const {
  w.beginObject();
  w.field("comm_id", id_).field("size", size()).field("rank", rank_).field("backend", "native");
  writeRankList(w, "global_ranks", worldRanks());
  writeRankList(w, "ring", worldRanks());  // comm rank r sends to r+1 in every ring algorithm
  w.key("transports").beginObject();
  for (const auto& ch : channels_)
    if (ch) w.field(std::to_string(worldRanks()[size_t(ch->peer().rank)]).c_str(), ch->kind());
  w.endObject();
  w.endObject();
}

void Communicator::writeState(JsonWriter& w, int64_t nowMono) const {
  w.beginObject();
  w.field("comm_id", id_).field("size", size()).field("rank", rank_).field("backend", "native");
  writeRankList(w, "global_ranks", worldRanks());
  writeRankList(w, "ring", worldRanks());
  w.field("last_coll_seq", __atomic_load_n(&cstats_->coll_seq, __ATOMIC_RELAXED));
  w.field("last_p2p_seq", __atomic_load_n(&cstats_->p2p_seq, __ATOMIC_RELAXED));
  bool failed = failed_.load();
  w.field("failed", failed);
  if (failed) w.field("cause", cause_);
  else w.nullField("cause");
  if (failed) writeFailure(w);
  else w.nullField("abort");
  InFlight f;
  OpRecord r{};
  if (inFlight(&f) && Recorder::instance().get(f.record_id, &r)) {
    w.key("in_flight").beginObject();
    writeInFlightFields(w, r, f.start_ns, nowMono);
    w.key("peers").beginArray();
    for (const auto& ch : channels_)
      if (ch)
        writePeerProgress(w, ch->peer().rank, worldRanks()[size_t(ch->peer().rank)], ch->kind(),
                          const_cast<Channel&>(*ch).progress(), nowMono);
    w.endArray();
    w.endObject();
  } else {
    w.nullField("in_flight");
  }
  w.key("links").beginArray();
  for (const auto& ch : channels_)
    if (ch)
      writeLinkCounters(w, ch->peer().rank, worldRanks()[size_t(ch->peer().rank)], ch->kind(),
                        const_cast<Channel&>(*ch).counters(), ch->localAddress(), ch->remoteAddress());
  w.endArray();
  w.endObject();
}

// comms[].abort: the failure as data (docs/dump-schema.md), in global ranks.
void Communicator::writeFailure(JsonWriter& w) const {
  const auto& world = worldRanks();
  auto rank = [&](const char* key, int commRank) {
    if (commRank >= 0 && size_t(commRank) < world.size()) w.field(key, world[size_t(commRank)]);
    else w.nullField(key);
  };
  w.key("abort").beginObject();
  w.field("kind", abortKindName(failure_.kind));
  rank("reporter", failure_.origin);
  rank("suspect", failure_.suspect);
  rank("received_from", failureFrom_);
  w.key("deviating").beginArray();
  if (voted_.load(std::memory_order_acquire))
    for (int r : deviating_) w.value(r);
  w.endArray();
  w.endObject();
}

}  // namespace hetobs
