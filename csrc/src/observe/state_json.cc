#include "hetobs/observe/state_json.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"
#include "hetobs/common/log.h"
#include "hetobs/common/wire.h"
#include "hetobs/transport/channel.h"
#include "hetobs/observe/runtime.h"

namespace hetobs {
namespace {

std::string joinRanks(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// The lowest member writes the communicator's file once per process; every member's
// metadata write would otherwise rewrite it (a rank file is rewritten per new comm).
void publishMembership(uint64_t commId, const std::string& hash, const std::vector<int>& members,
                       const std::vector<int>& ring) {
  Runtime* rt = Runtime::get();
  if (!rt || members.empty() || rt->config().rank != *std::min_element(members.begin(), members.end())) return;
  static std::mutex mu;
  static std::set<std::pair<uint64_t, std::string>> published;
  std::lock_guard<std::mutex> g(mu);
  if (published.count({commId, hash})) return;
  JsonWriter w;
  w.beginObject();
  w.field("schema", "hetobs.comm").field("version", "1.0");
  w.field("job", rt->config().job).field("comm_id", commId).field("hash", hash);
  w.field("size", int(members.size())).field("written_by", rt->config().rank);
  writeRankList(w, "global_ranks", members);
  writeRankList(w, "ring", ring);
  w.endObject();
  try {
    rt->jobDir().writeCommFile(commId, hash, w.str());
    published.insert({commId, hash});
  } catch (const Error& e) {
    HETOBS_WARN("cannot write the membership of comm %llu: %s", (unsigned long long)commId, e.what());
  }
}

}  // namespace

std::string membershipHash(const std::vector<int>& members, const std::vector<int>& ring) {
  std::string text = "global_ranks=" + joinRanks(members) + ";ring=" + joinRanks(ring);
  Digest d = sha256(text.data(), text.size());
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out += kHex[d[size_t(i)] >> 4];
    out += kHex[d[size_t(i)] & 15];
  }
  return out;
}

void writeMembership(JsonWriter& w, uint64_t commId, const std::vector<int>& members, const std::vector<int>& ring,
                     bool publish) {
  std::string hash = membershipHash(members, ring);
  if (publish) publishMembership(commId, hash, members, ring);
  w.key("membership").beginObject();
  w.field("hash", hash).field("lowest_rank", members.empty() ? -1 : *std::min_element(members.begin(), members.end()));
  w.endObject();
}

bool peerHasProgress(const PeerProgress& p) {
  return p.send_posted.load() || p.send_sent.load() || p.send_acked.load() || p.send_done.load() ||
         p.recv_posted.load() || p.recv_received.load() || p.recv_done.load();
}

bool linkCarriedData(const LinkCounters& k) {
  return k.bytes_sent.load() || k.bytes_recv.load() || k.frames_sent.load() || k.frames_recv.load();
}

bool ringNeighbour(int commRank, int peer, int size) {
  return size > 1 && (peer == (commRank + 1) % size || peer == (commRank + size - 1) % size);
}

void writeRankList(JsonWriter& w, const char* key, const std::vector<int>& ranks) {
  w.key(key).beginArray();
  for (int r : ranks) w.value(r);
  w.endArray();
}

void writeCauseInfo(JsonWriter& w, const char* key, const CauseInfo& c) {
  if (c.empty()) {
    w.nullField(key);
    return;
  }
  auto rankOrNull = [&](const char* k, int r) {
    if (r >= 0) w.field(k, r);
    else w.nullField(k);
  };
  w.key(key).beginObject();
  w.field("kind", c.kind);
  writeRankList(w, "culprits", c.culprits);
  rankOrNull("reporter", c.reporter);
  writeRankList(w, "messengers", c.messengers);
  if (!c.op.empty()) w.field("op", c.op);
  else w.nullField("op");
  if (c.seq >= 0) w.field("seq", c.seq);
  else w.nullField("seq");
  rankOrNull("peer", c.peer);
  w.field("gone", c.gone);
  if (c.comm >= 0) w.field("comm_id", c.comm);
  if (c.element >= 0) w.field("element", c.element);
  w.endObject();
}

void writeWaitingOn(JsonWriter& w, const std::vector<WaitedPeer>& waits) {
  w.key("waiting_on").beginArray();
  for (const WaitedPeer& x : waits) {
    w.beginObject();
    w.field("rank", x.rank).field("direction", x.send ? "send" : "recv");
    w.field("posted", x.posted).field("done", x.done);
    w.endObject();
  }
  w.endArray();
}

void addWaits(std::vector<WaitedPeer>* out, int globalRank, const PeerProgress& p) {
  uint64_t rp = p.recv_posted.load(std::memory_order_relaxed), rd = p.recv_done.load(std::memory_order_relaxed);
  uint64_t sp = p.send_posted.load(std::memory_order_relaxed), sd = p.send_done.load(std::memory_order_relaxed);
  if (rp > rd) out->push_back(WaitedPeer{globalRank, false, rp, rd});
  if (sp > sd) out->push_back(WaitedPeer{globalRank, true, sp, sd});
}

std::vector<int> waitedRanks(const std::vector<WaitedPeer>& waits) {
  std::vector<int> out;
  for (const WaitedPeer& x : waits)
    if (std::find(out.begin(), out.end(), x.rank) == out.end()) out.push_back(x.rank);
  return out;
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
                       const std::string& localAddress, const std::string& remoteAddress, uint64_t reconnects,
                       const LinkHealth* health, const ReconnectHistory* history) {
  w.beginObject();
  w.field("peer", peer).field("global_peer", globalPeer).field("transport", transport);
  w.field("local_address", localAddress).field("remote_address", remoteAddress);
  w.field("bytes_sent", k.bytes_sent.load()).field("bytes_recv", k.bytes_recv.load());
  w.field("frames_sent", k.frames_sent.load()).field("frames_recv", k.frames_recv.load());
  w.field("busy_ns", k.busy_ns.load());
  writeWallTimeOrNull(w, "last_activity_ns", k.last_activity_ns.load());
  w.field("reconnects", reconnects);
  if (health && health->samples.load()) {
    const LinkHealthSnapshot h = LinkHealthSnapshot::of(*health);
    w.key("tcp").beginObject();
    w.field("sampled_ns", h.sampled_ns).field("rtt_us", h.rtt_us).field("rttvar_us", h.rttvar_us);
    w.field("retransmits_total", h.retransmits_total).field("retransmitting", h.retransmitting);
    w.field("unacked", h.unacked).field("lost", h.lost).field("delivery_rate_bps", h.delivery_rate_bps);
    w.field("bytes_acked", h.bytes_acked).field("bytes_received", h.bytes_received);
    w.field("ms_since_data_sent", h.ms_since_data_sent).field("ms_since_data_recv", h.ms_since_data_recv);
    w.field("ms_since_ack_recv", h.ms_since_ack_recv).field("rate_app_limited", h.rate_app_limited);
    w.endObject();
  } else {
    w.nullField("tcp");
  }
  if (history && history->breaks) {
    w.key("reconnect").beginObject();
    w.field("state", history->state).field("breaks", history->breaks).field("attempts", history->attempts);
    w.key("events").beginArray();
    for (const auto& e : history->events) {
      w.beginObject();
      w.field("time_ns", e.wall_ns).field("stage", e.stage).field("errno", e.err).field("refused_ns", e.refused_ns);
      w.field("what", e.what);
      w.endObject();
    }
    w.endArray();
    w.endObject();
  } else {
    w.nullField("reconnect");
  }
  w.endObject();
}

}  // namespace hetobs
