// What a communicator says about itself in dumps and in the rank's metadata file
// (docs/dump-schema.md). Runs on the watchdog or an erroring op thread; reads only
// atomics, the record ring, fields fixed after connect(), and the channels and relay state
// under observeMu_ (close() removes them).
#include "hetobs/comm/communicator.h"
#include "hetobs/observe/state_json.h"
#include "hetobs/record/recorder.h"
#include "hetobs/relay/relay_state.h"

namespace hetobs {

void Communicator::writeMetadata(JsonWriter& w) const {
  std::lock_guard<std::mutex> g(observeMu_);  // close() may be taking the channels away
  w.beginObject();
  w.field("comm_id", id_).field("size", size()).field("rank", rank_).field("backend", "native");
  writeMembership(w, id_, worldRanks(), worldRanks(), true);  // ring: comm rank r sends to r+1
  w.key("transports").beginObject();  // ring neighbours only: a rank file must not grow with the comm
  for (const auto& ch : channels_)
    if (ch && ringNeighbour(rank_, ch->peer().rank, size()))
      w.field(std::to_string(worldRanks()[size_t(ch->peer().rank)]).c_str(), ch->kind());
  w.endObject();
  w.endObject();
}

// Per peer, how many chunks reached each stage: a diagnosis tells data that stopped in
// the device copy (copied_in < send_chunks, sent == copied_in) from data that stopped on
// the wire (sent < copied_in on one end, received < its peer's sent on the other).
void Communicator::writeRelayState(JsonWriter& w) const {
  const RelayState* st = relayLive_.load(std::memory_order_acquire);
  if (!st) return;
  w.key("relay").beginObject();
  auto stage = RelayStage(st->stage.load(std::memory_order_relaxed));
  w.field("stage", relayStageName(stage));
  if (stage == RelayStage::kDevice || stage == RelayStage::kCuda) {
    int type = st->device_type.load(std::memory_order_relaxed);
    w.field("device", stage == RelayStage::kCuda ? std::string("cuda") : deviceTypeNameOf(type));
    w.field("device_index", st->device_index.load(std::memory_order_relaxed));
  }
  w.field("pipeline", st->pipeline.load(std::memory_order_relaxed));
  w.field("chunk_bytes", st->chunk_bytes.load(std::memory_order_relaxed));
  w.field("slots", st->slots.load(std::memory_order_relaxed));
  w.key("peers").beginArray();
  const auto& pc = st->peers();
  for (size_t p = 0; p < pc.size(); ++p) {
    const RelayPeerCounters& c = pc[p];
    uint64_t sc = c.send_chunks.load(std::memory_order_relaxed), rc = c.recv_chunks.load(std::memory_order_relaxed);
    if (!sc && !rc) continue;
    w.beginObject();
    w.field("peer", int(p)).field("global_peer", worldRanks()[p]);
    w.key("send").beginObject();
    w.field("chunks", sc).field("copied_in", c.copied_in.load(std::memory_order_relaxed));
    w.field("sent", c.sent.load(std::memory_order_relaxed));
    w.endObject();
    w.key("recv").beginObject();
    w.field("chunks", rc).field("received", c.received.load(std::memory_order_relaxed));
    w.field("copied_out", c.copied_out.load(std::memory_order_relaxed));
    w.endObject();
    w.endObject();
  }
  w.endArray();
  w.endObject();
}

void Communicator::writeState(JsonWriter& w, int64_t nowMono) const {
  std::lock_guard<std::mutex> g(observeMu_);  // close() may be taking the channels and relay away
  w.beginObject();
  w.field("comm_id", id_).field("size", size()).field("rank", rank_).field("backend", "native");
  writeMembership(w, id_, worldRanks(), worldRanks(), false);
  w.field("last_coll_seq", __atomic_load_n(&cstats_->coll_seq, __ATOMIC_RELAXED));
  w.field("last_p2p_seq", __atomic_load_n(&cstats_->p2p_seq, __ATOMIC_RELAXED));
  bool failed = failure_.failed.load();
  w.field("failed", failed);
  if (failed) w.field("cause", failure_.cause);
  else w.nullField("cause");
  if (failed) failure_.writeAbort(w, worldRanks());
  else w.nullField("abort");
  writeCauseInfo(w, "cause_info", failed ? causeInfo(failure_.seq) : CauseInfo{});
  InFlight f;
  OpRecord r{};
  bool running = inFlightLocked(&f) && Recorder::instance().get(f.record_id, &r);
  // Sections only for the peers that matter (state_json.h): a dump's size must not grow with the comm.
  auto wanted = [&](const Channel& ch, bool link) {
    auto& c = const_cast<Channel&>(ch);
    return ringNeighbour(rank_, ch.peer().rank, size()) || (running && peerHasProgress(c.progress())) ||
           (link && linkCarriedData(c.counters()));
  };
  if (running) {
    w.key("in_flight").beginObject();
    writeInFlightFields(w, r, f.start_ns, nowMono);
    w.key("peers").beginArray();
    for (const auto& ch : channels_)
      if (ch && wanted(*ch, false))
        writePeerProgress(w, ch->peer().rank, worldRanks()[size_t(ch->peer().rank)], ch->kind(),
                          const_cast<Channel&>(*ch).progress(), nowMono);
    w.endArray();
    writeWaitingOn(w, f.waits);
    if (OpKind(r.op) == OpKind::kRelay) writeRelayState(w);
    w.endObject();
  } else {
    w.nullField("in_flight");
  }
  w.key("links").beginArray();
  for (const auto& ch : channels_)
    if (ch && wanted(*ch, true)) {
      auto& c = const_cast<Channel&>(*ch);
      c.sampleHealth();  // the kernel's state as of this dump: what tells the silent direction
      ReconnectHistory history;
      bool remakes = ch->reconnectHistory(&history);
      writeLinkCounters(w, ch->peer().rank, worldRanks()[size_t(ch->peer().rank)], ch->kind(), c.counters(),
                        ch->localAddress(), ch->remoteAddress(), c.reconnects().load(std::memory_order_relaxed),
                        &c.health(), remakes ? &history : nullptr);
    }
  w.endArray();
  w.endObject();
}

CauseInfo Communicator::causeInfo(uint64_t seq) const {
  OpDesc d = desc_;
  if (!isP2P(d.op) && seq != d.seq && history_[seq % kHistory].seq == seq) d = history_[seq % kHistory];
  return failure_.causeInfo(worldRanks(), d, seq);
}

}  // namespace hetobs
