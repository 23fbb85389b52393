// What a communicator says about itself in dumps and in the rank's metadata file
// (docs/dump-schema.md). Runs on the watchdog or an erroring op thread; reads only
// atomics, the record ring and fields fixed after connect().
#include "hetobs/comm/communicator.h"
#include "hetobs/common/clock.h"
#include "hetobs/record/recorder.h"

namespace hetobs {
namespace {

void writeTimeOrNull(JsonWriter& w, const char* key, int64_t mono) {
  if (mono) w.field(key, monoToWallNs(mono));
  else w.nullField(key);
}

}  // namespace

void Communicator::writeMetadata(JsonWriter& w) const {
  w.beginObject();
  w.field("comm_id", id_).field("size", size()).field("rank", rank_);
  w.key("global_ranks").beginArray();
  for (int g : worldRanks()) w.value(g);
  w.endArray();
  // Ring order: comm rank r sends to r+1 in every ring algorithm.
  w.key("ring").beginArray();
  for (int g : worldRanks()) w.value(g);
  w.endArray();
  w.key("transports").beginObject();
  for (const auto& ch : channels_)
    if (ch) w.field(std::to_string(worldRanks()[size_t(ch->peer().rank)]).c_str(), ch->kind());
  w.endObject();
  w.endObject();
}

void Communicator::writeState(JsonWriter& w, int64_t nowMono) const {
  w.beginObject();
  w.field("comm_id", id_).field("size", size()).field("rank", rank_);
  w.key("global_ranks").beginArray();
  for (int g : worldRanks()) w.value(g);
  w.endArray();
  w.key("ring").beginArray();
  for (int g : worldRanks()) w.value(g);
  w.endArray();
  w.field("last_coll_seq", __atomic_load_n(&cstats_->coll_seq, __ATOMIC_RELAXED));
  w.field("last_p2p_seq", __atomic_load_n(&cstats_->p2p_seq, __ATOMIC_RELAXED));
  bool failed = failed_.load();
  w.field("failed", failed);
  if (failed) w.field("cause", cause_);
  else w.nullField("cause");

  InFlight f;
  OpRecord r{};
  if (inFlight(&f) && Recorder::instance().get(f.record_id, &r)) {
    bool p2p = isP2P(OpKind(r.op));
    w.key("in_flight").beginObject();
    w.field("record_id", r.record_id).field("collective_seq_id", r.coll_seq).field("p2p_seq_id", r.p2p_seq);
    w.field("op", opName(OpKind(r.op))).field("dtype", dtypeName(DType(r.dtype)));
    w.field("count", r.count).field("bytes", r.bytes);
    if (!p2p && r.root_or_peer >= 0) w.field("root", r.root_or_peer);
    else w.nullField("root");
    if (p2p) w.field("peer", r.root_or_peer);
    else w.nullField("peer");
    w.field("algorithm", algorithmName(Algorithm(r.algorithm)));
    w.field("state", opStateName(OpState(r.state)));
    writeTimeOrNull(w, "time_created_ns", r.t_enqueue_ns);
    writeTimeOrNull(w, "time_discovered_started_ns", r.t_start_ns);
    w.field("seconds_in_op", double(nowMono - f.start_ns) / 1e9);
    w.key("peers").beginArray();
    for (const auto& ch : channels_) {
      if (!ch) continue;
      auto& p = const_cast<Channel&>(*ch).progress();
      w.beginObject();
      w.field("peer", ch->peer().rank).field("global_peer", worldRanks()[size_t(ch->peer().rank)]);
      w.field("transport", ch->kind());
      w.key("send").beginObject();
      w.field("posted", p.send_posted.load()).field("sent", p.send_sent.load());
      w.field("acked", p.send_acked.load()).field("done", p.send_done.load());
      w.endObject();
      w.key("recv").beginObject();
      w.field("posted", p.recv_posted.load()).field("received", p.recv_received.load());
      w.field("done", p.recv_done.load());
      w.endObject();
      int64_t t = p.last_change_ns.load();
      writeTimeOrNull(w, "last_change_ns", t);
      if (t) w.field("seconds_since_change", double(nowMono - t) / 1e9);
      else w.nullField("seconds_since_change");
      w.endObject();
    }
    w.endArray();
    w.endObject();
  } else {
    w.nullField("in_flight");
  }
  w.key("links").beginArray();
  for (const auto& ch : channels_) {
    if (!ch) continue;
    auto& k = const_cast<Channel&>(*ch).counters();
    w.beginObject();
    w.field("peer", ch->peer().rank).field("global_peer", worldRanks()[size_t(ch->peer().rank)]);
    w.field("transport", ch->kind());
    w.field("local_address", ch->localAddress()).field("remote_address", ch->remoteAddress());
    w.field("bytes_sent", k.bytes_sent.load()).field("bytes_recv", k.bytes_recv.load());
    w.field("frames_sent", k.frames_sent.load()).field("frames_recv", k.frames_recv.load());
    w.field("busy_ns", k.busy_ns.load());
    writeTimeOrNull(w, "last_activity_ns", k.last_activity_ns.load());
    w.endObject();
  }
  w.endArray();
  w.endObject();
}

}  // namespace hetobs
