#include "nccl_comm.h"

#include <cstring>

#include "hetobs/common/clock.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/observe/state_json.h"

namespace hetobs {
namespace nccl {
NcclComm::NcclComm(uint64_t id, std::vector<int> globalRanks, int rank, int device, std::string name)
    : ExternalComm(id, std::move(globalRanks), rank, Backend::kNccl, DeviceType::kCuda, std::move(name)),
      device_(device),
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
  // The profiler's per-peer progress, where it has any, says more than the op's own peer.
  std::vector<WaitedPeer> waits;
  std::string text;
  for (size_t i = 0; i < global_.size(); ++i) {
    const stats::LinkStats* l = links_[i].load(std::memory_order_acquire);
    if (!l) continue;
    const PeerProgress& p = l->progress;
    int64_t t = p.last_change_ns.load(std::memory_order_relaxed);
    if (t > out->last_progress_ns) out->last_progress_ns = t;
    size_t before = waits.size();
    addWaits(&waits, global_[i], p);
    if (waits.size() > before) text += (text.empty() ? "rank " : ", rank ") + std::to_string(global_[i]);
  }
  if (!waits.empty()) {
    out->waits = std::move(waits);
    out->waiting_on = std::move(text);
  }
  return true;
}

void NcclComm::writePeers(JsonWriter& w, int64_t nowMono) const {
  w.beginArray();
  for (size_t i = 0; i < global_.size(); ++i)
    if (const stats::LinkStats* l = links_[i].load(std::memory_order_acquire))
      writePeerProgress(w, int(i), global_[i], "net", l->progress, nowMono);
  w.endArray();
}

void NcclComm::writeLinks(JsonWriter& w) const {
  w.beginArray();
  for (size_t i = 0; i < global_.size(); ++i)
    if (const stats::LinkStats* l = links_[i].load(std::memory_order_acquire))
      writeLinkCounters(w, int(i), global_[i], "net", l->counters, "", "");
  w.endArray();
}

}  // namespace nccl
}  // namespace hetobs
