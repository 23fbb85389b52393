#include "nccl_comm.h"

#include <cstring>

#include "hetobs/common/clock.h"
#include "hetobs/observe/runtime.h"

namespace hetobs {
namespace nccl {
namespace {

void timeOrNull(JsonWriter& w, const char* key, int64_t mono) {
  if (mono) w.field(key, monoToWallNs(mono));
  else w.nullField(key);
}

// Replace the first occurrence of `what` (an empty array the base class wrote under a
// key) with `with`. Keys and string values are escaped by the writer, so the quoted
// key can only match the key itself.
void splice(std::string& s, const char* what, const std::string& with) {
  size_t at = s.find(what);
  if (at != std::string::npos) s.replace(at, strlen(what), with);
}

}  // namespace

NcclComm::NcclComm(uint64_t id, std::vector<int> globalRanks, int rank, int device, std::string name)
    : ExternalComm(id, globalRanks, rank, Backend::kNccl, DeviceType::kCuda, std::move(name)),
      device_(device),
      global_(std::move(globalRanks)),
      links_(new std::atomic<stats::LinkStats*>[global_.size()]) {
  for (size_t i = 0; i < global_.size(); ++i) links_[i].store(nullptr, std::memory_order_relaxed);
  createdNs = monoNs();
}

int NcclComm::globalOf(int peer) const { return global_[size_t(peer)]; }

stats::LinkStats* NcclComm::link(int peer) {
  if (peer < 0 || size_t(peer) >= global_.size()) return nullptr;
  stats::LinkStats* l = links_[size_t(peer)].load(std::memory_order_acquire);
  if (l) return l;
  std::lock_guard<std::mutex> g(linkMu_);
  l = links_[size_t(peer)].load(std::memory_order_acquire);
  if (l) return l;
  Runtime* rt = Runtime::get();
  l = rt ? rt->stats().allocLink() : nullptr;
  if (!l) {  // segment full (or no runtime): keep it private, dumps still show it
    ownLinks_.push_back(std::make_unique<stats::LinkStats>());
    l = ownLinks_.back().get();
  }
  l->comm_id = id();
  l->peer = peer;
  l->global_peer = globalOf(peer);
  memset(l->transport, 0, sizeof l->transport);
  memcpy(l->transport, "net", 3);  // NCCL's proxy carries network transfers only
  links_[size_t(peer)].store(l, std::memory_order_release);
  return l;
}

bool NcclComm::inFlight(InFlight* out) const {
  if (!ExternalComm::inFlight(out)) return false;
  for (size_t i = 0; i < global_.size(); ++i) {
    const stats::LinkStats* l = links_[i].load(std::memory_order_acquire);
    if (!l) continue;
    const PeerProgress& p = l->progress;
    int64_t t = p.last_change_ns.load(std::memory_order_relaxed);
    if (t > out->last_progress_ns) out->last_progress_ns = t;
    bool waiting = p.recv_posted.load(std::memory_order_relaxed) > p.recv_done.load(std::memory_order_relaxed) ||
                   p.send_posted.load(std::memory_order_relaxed) > p.send_done.load(std::memory_order_relaxed);
    if (waiting)
      out->waiting_on += (out->waiting_on.empty() ? "rank " : ", rank ") + std::to_string(global_[i]);
  }
  return true;
}

void NcclComm::writePeers(JsonWriter& w, int64_t nowMono) const {
  w.beginArray();
  for (size_t i = 0; i < global_.size(); ++i) {
    const stats::LinkStats* l = links_[i].load(std::memory_order_acquire);
    if (!l) continue;
    const PeerProgress& p = l->progress;
    w.beginObject();
    w.field("peer", int(i)).field("global_peer", global_[i]).field("transport", "net");
    w.key("send").beginObject();
    w.field("posted", p.send_posted.load()).field("sent", p.send_sent.load());
    w.field("acked", p.send_acked.load()).field("done", p.send_done.load());
    w.endObject();
    w.key("recv").beginObject();
    w.field("posted", p.recv_posted.load()).field("received", p.recv_received.load());
    w.field("done", p.recv_done.load());
    w.endObject();
    int64_t t = p.last_change_ns.load();
    timeOrNull(w, "last_change_ns", t);
    if (t) w.field("seconds_since_change", double(nowMono - t) / 1e9);
    else w.nullField("seconds_since_change");
    w.endObject();
  }
  w.endArray();
}

void NcclComm::writeLinks(JsonWriter& w) const {
  w.beginArray();
  for (size_t i = 0; i < global_.size(); ++i) {
    const stats::LinkStats* l = links_[i].load(std::memory_order_acquire);
    if (!l) continue;
    const LinkCounters& k = l->counters;
    w.beginObject();
    w.field("peer", int(i)).field("global_peer", global_[i]).field("transport", "net");
    w.field("bytes_sent", k.bytes_sent.load()).field("bytes_recv", k.bytes_recv.load());
    w.field("busy_ns", k.busy_ns.load());
    timeOrNull(w, "last_activity_ns", k.last_activity_ns.load());
    w.endObject();
  }
  w.endArray();
}

void NcclComm::writeState(JsonWriter& w, int64_t nowMono) const {
  // The base class writes the comm entry with empty "peers" and "links"; fill them in.
  JsonWriter base;
  ExternalComm::writeState(base, nowMono);
  std::string s = base.take();
  JsonWriter peers, links;
  writePeers(peers, nowMono);
  writeLinks(links);
  splice(s, "\"peers\":[]", "\"peers\":" + peers.str());
  splice(s, "\"links\":[]", "\"links\":" + links.str());
  w.raw(s);
}

}  // namespace nccl
}  // namespace hetobs
