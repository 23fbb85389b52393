#include "hetobs/observe/state_json.h"

#include <cstring>

#include "hetobs/common/clock.h"
#include "hetobs/common/wire.h"

namespace hetobs {

void writeRankList(JsonWriter& w, const char* key, const std::vector<int>& ranks) {
  w.key(key).beginArray();
  for (int r : ranks) w.value(r);
  w.endArray();
}

void writeWallTimeOrNull(JsonWriter& w, const char* key, int64_t monoNs) {
  if (monoNs) w.field(key, monoToWallNs(monoNs));
  else w.nullField(key);
}

void writeInFlightFields(JsonWriter& w, const OpRecord& r, int64_t startMono, int64_t nowMono) {
  bool p2p = isP2P(OpKind(r.op));
  w.field("record_id", r.record_id).field("collective_seq_id", r.coll_seq).field("p2p_seq_id", r.p2p_seq);
  w.field("op", opName(OpKind(r.op))).field("dtype", dtypeName(DType(r.dtype)));
  w.field("count", r.count).field("bytes", r.bytes);
  if (!p2p && r.root_or_peer >= 0) w.field("root", r.root_or_peer);
  else w.nullField("root");
  if (p2p) w.field("peer", r.root_or_peer);
  else w.nullField("peer");
  w.field("algorithm", algorithmName(Algorithm(r.algorithm))).field("state", opStateName(OpState(r.state)));
  w.field("backend", backendName(Backend(r.backend)));
  writeIslandFields(w, r, false);  // phase times are known only once the op ends
  writeWallTimeOrNull(w, "time_created_ns", r.t_enqueue_ns);
  writeWallTimeOrNull(w, "time_discovered_started_ns", r.t_start_ns);
  w.field("seconds_in_op", double(nowMono - startMono) / 1e9);
}

void writeIslandFields(JsonWriter& w, const OpRecord& r, bool phases) {
  if (!r.island[0]) return;
  w.field("island", std::string(r.island, strnlen(r.island, sizeof r.island)));
  if (!phases) return;
  w.key("phases").beginObject();
  w.field("vendor_ns", r.phases.vendor_ns).field("d2h_ns", r.phases.d2h_ns);
  w.field("wire_ns", r.phases.wire_ns).field("h2d_ns", r.phases.h2d_ns).field("chunks", r.phases.chunks);
  w.endObject();
}

void writePeerProgress(JsonWriter& w, int peer, int globalPeer, const char* transport, const PeerProgress& p,
                       int64_t nowMono) {
  w.beginObject();
  w.field("peer", peer).field("global_peer", globalPeer).field("transport", transport);
  w.key("send").beginObject();
  w.field("posted", p.send_posted.load()).field("sent", p.send_sent.load());
  w.field("acked", p.send_acked.load()).field("done", p.send_done.load());
  w.endObject();
  w.key("recv").beginObject();
  w.field("posted", p.recv_posted.load()).field("received", p.recv_received.load());
  w.field("done", p.recv_done.load());
  w.endObject();
  int64_t t = p.last_change_ns.load();
  writeWallTimeOrNull(w, "last_change_ns", t);
  if (t) w.field("seconds_since_change", double(nowMono - t) / 1e9);
  else w.nullField("seconds_since_change");
  w.endObject();
}

void writeLinkCounters(JsonWriter& w, int peer, int globalPeer, const char* transport, const LinkCounters& k,
                       const std::string& localAddress, const std::string& remoteAddress) {
  w.beginObject();
  w.field("peer", peer).field("global_peer", globalPeer).field("transport", transport);
  w.field("local_address", localAddress).field("remote_address", remoteAddress);
  w.field("bytes_sent", k.bytes_sent.load()).field("bytes_recv", k.bytes_recv.load());
  w.field("frames_sent", k.frames_sent.load()).field("frames_recv", k.frames_recv.load());
  w.field("busy_ns", k.busy_ns.load());
  writeWallTimeOrNull(w, "last_activity_ns", k.last_activity_ns.load());
  w.endObject();
}

}  // namespace hetobs
