#include "hetobs/observe/external_comm.h"

#include <algorithm>
#include <cstring>

#include "hetobs/common/clock.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/observe/data_mismatch.h"
#include "hetobs/observe/op_scope.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/observe/state_json.h"
#include "hetobs/stats/op_stats.h"
#include "hetobs/record/recorder.h"

namespace hetobs {

ExternalComm::ExternalComm(uint64_t id, std::vector<int> globalRanks, int rank, Backend backend, DeviceType device,
                           std::string name, std::string island, std::string deviceName, std::string library)
    : global_(std::move(globalRanks)), id_(id), rank_(rank), backend_(backend), device_(device),
      name_(std::move(name)) {
  setName(island_, island.c_str());
  setName(deviceName_, deviceName.empty() ? deviceTypeName(device) : deviceName.c_str());
  setName(library_, library.c_str());
}

void ExternalComm::setGlobalRanks(std::vector<int> ranks) {
  if (ranks.size() == global_.size()) global_ = std::move(ranks);
}

void ExternalComm::attach() {
  cstats_ = Runtime::commStats(&ownStats_, id_, size(), rank_);
  scope_.bind(cstats_, OpScope::Writers::kMany);
  if (Runtime* rt = Runtime::get()) {
    header_ = rt->stats().header();
    // A rank is in one island: the first island communicator names it for readers of the segment.
    if (island_[0] && !header_->island[0]) {
      memcpy(header_->island_device, deviceName_, sizeof deviceName_);
      memcpy(header_->island_library, library_, sizeof library_);
      memcpy(header_->island, island_, sizeof island_);  // last: a reader that sees the island sees the rest
    }
    rt->registerComm(shared_from_this());
  }
}

ExternalComm::Slot* ExternalComm::slotOf(uint64_t token) {
  return const_cast<Slot*>(static_cast<const ExternalComm*>(this)->slotOf(token));
}

const ExternalComm::Slot* ExternalComm::slotOf(uint64_t token) const {
  if (token == 0 || token >> 63) return nullptr;  // unwatched ops have no slot
  for (size_t i = 0; i < kMaxInFlight; ++i) {  // begin() claimed the first free slot from rid: usually i == 0
    const Slot& s = slots_[(token - 1 + i) % kMaxInFlight];
    if (s.token.load(std::memory_order_acquire) == token) return &s;
  }
  return nullptr;
}

void ExternalComm::setPhase(uint64_t token, IslandPhase phase) {
  Slot* s = slotOf(token);
  if (!s) return;
  int64_t now = monoNs();
  s->phase_ns.store(now, std::memory_order_relaxed);
  s->phase.store(uint8_t(phase), std::memory_order_relaxed);
  // A phase change is progress, for the watchdog (inFlight) and for the segment's readers alike.
  if (Runtime* rt = Runtime::get()) rt->noteProgressAt(now);
}

uint64_t ExternalComm::begin(const ExternalOp& o) {
  int64_t now = monoNs();
  bool p2p = isP2P(o.op);
  OpRecord rec{};
  rec.comm_id = id_;
  if (p2p) rec.p2p_seq = p2pSeq_.fetch_add(1, std::memory_order_relaxed) + 1;
  else rec.coll_seq = collSeq_.fetch_add(1, std::memory_order_relaxed) + 1;
  rec.count = o.count;
  rec.out_count = o.out_count;
  rec.bytes = o.bytes;
  rec.t_enqueue_ns = o.enqueue_ns ? o.enqueue_ns : now;
  rec.t_start_ns = now;
  rec.root_or_peer = o.root_or_peer;
  rec.comm_size = size();
  rec.comm_rank = rank_;
  rec.op = uint8_t(o.op);
  rec.dtype = uint8_t(o.dtype);
  rec.redop = uint8_t(o.redop);
  rec.state = uint8_t(OpState::kStarted);
  rec.algorithm = uint8_t(p2p ? Algorithm::kP2P : Algorithm::kNone);
  rec.backend = uint8_t(backend_);
  rec.device_type = uint8_t(device_);
  memcpy(rec.island, island_, sizeof island_);
  memcpy(rec.device, deviceName_, sizeof deviceName_);
  memcpy(rec.library, library_, sizeof library_);
  uint64_t rid = scope_.begin(rec);
  for (size_t i = 0; i < kMaxInFlight; ++i) {
    uint64_t free = 0;
    Slot& s = slots_[(rid + i) % kMaxInFlight];
    if (s.token.load(std::memory_order_relaxed) == 0 &&
        s.token.compare_exchange_strong(free, rid + 1, std::memory_order_acq_rel)) {
      s.start_ns.store(now, std::memory_order_relaxed);
      s.bytes.store(o.bytes, std::memory_order_relaxed);
      s.op.store(uint8_t(o.op), std::memory_order_relaxed);
      s.peer.store(p2p ? o.root_or_peer : -1, std::memory_order_relaxed);
      s.phase.store(uint8_t(IslandPhase::kNone), std::memory_order_relaxed);
      s.phase_ns.store(now, std::memory_order_relaxed);
      watched_.fetch_add(1, std::memory_order_relaxed);
      return rid + 1;
    }
  }
  return (rid + 1) | (1ull << 63);  // recorded, but not watched
}

void ExternalComm::end(uint64_t token, bool ok, const char* error, int64_t startMono, int64_t endMono,
                       const IslandPhases* phases) {
  if (token == 0) return;
  uint64_t rid = (token & ~(1ull << 63)) - 1;
  int64_t now = endMono ? endMono : monoNs();
  if (startMono) Recorder::instance().markStarted(rid, startMono);
  Recorder::instance().markFinished(rid, now, ok, error, phases);
  if (header_ && island_[0]) {
    if (phases) {
      auto add = [](std::atomic<uint64_t>& a, int64_t ns) {
        a.fetch_add(uint64_t(std::max<int64_t>(ns, 0)), std::memory_order_relaxed);
      };
      add(header_->island_vendor_ns, phases->vendor_ns);
      add(header_->island_d2h_ns, phases->d2h_ns);
      add(header_->island_wire_ns, phases->wire_ns);
      add(header_->island_h2d_ns, phases->h2d_ns);
      header_->island_chunks.fetch_add(phases->chunks, std::memory_order_relaxed);
    }
    header_->island_ops.fetch_add(1, std::memory_order_relaxed);
  }
  int64_t start = now;
  uint64_t bytes = 0;
  uint8_t op = 0;
  bool found = false;
  if (!(token >> 63)) {
    for (size_t i = 0; i < kMaxInFlight && !found; ++i) {
      Slot& c = slots_[(rid + i) % kMaxInFlight];
      if (c.token.load(std::memory_order_acquire) == token) {
        start = c.start_ns.load(std::memory_order_relaxed);
        bytes = c.bytes.load(std::memory_order_relaxed);
        op = c.op.load(std::memory_order_relaxed);
        c.phase.store(uint8_t(IslandPhase::kNone), std::memory_order_relaxed);
        c.token.store(0, std::memory_order_release);
        watched_.fetch_sub(1, std::memory_order_relaxed);
        found = true;
      }
    }
  }
  if (!found) {
    OpRecord r{};
    if (Recorder::instance().get(rid, &r)) {
      start = r.t_start_ns;
      bytes = r.bytes;
      op = r.op;
    }
  }
  if (startMono) start = startMono;
  scope_.ended(op, bytes, now - start, now, ok, busBwFactor(op, size()), watched_.load(std::memory_order_relaxed) == 0);
}

bool ExternalComm::digestDue(uint64_t token) const {
  const DigestSettings& ds = digestSettings();
  if (__builtin_expect(!ds.on && ds.flip_seq < 0, 1) || token == 0 || size() < 2) return false;
  OpRecord r{};
  if (!Recorder::instance().get((token & ~(1ull << 63)) - 1, &r) || isP2P(OpKind(r.op))) return false;
  return int64_t(r.coll_seq) == ds.flip_seq || (ds.on && ds.every && r.coll_seq % ds.every == 0);
}

int ExternalComm::checkResult(uint64_t token, uint8_t* data, size_t count, size_t es, const GatherFn& gather,
                              std::string* msg) {
  const DigestSettings& ds = digestSettings();
  OpRecord r{};
  if (token == 0 || !Recorder::instance().get((token & ~(1ull << 63)) - 1, &r)) return kDigestSame;
  if (int64_t(r.coll_seq) == ds.flip_seq) flipBit(data, count, es, ds.flip_element, ds.flip_bit);  // test only
  if (!ds.on || !ds.every || r.coll_seq % ds.every != 0) return kDigestSame;
  std::vector<uint8_t> scratch(global_.size() * 8);
  DigestVerdict v;
  const bool differs = compareResults(size(), data, count, es, gather, scratch.data(), &v);
  const bool mine = differs && std::find(v.differing.begin(), v.differing.end(), rank_) != v.differing.end();
  scope_.update([&](stats::CommStats& c, auto add, auto) {
    add(c.digests_checked, 1);
    if (mine) add(c.data_mismatches, 1);
  });
  if (!differs) return kDigestSame;
  MismatchSite site;
  site.comm_id = id_;
  site.world = &global_;
  site.rank = rank_;
  site.op = OpKind(r.op);
  site.seq = r.coll_seq;
  site.what = strFormat("%s seq %llu count %llu", opName(site.op), (unsigned long long)r.coll_seq,
                        (unsigned long long)r.count);
  std::vector<int> ranks;
  *msg = reportDataMismatch(v, site, &ranks);
  return ds.raise ? kDigestRaise : kDigestLogged;
}

bool ExternalComm::inFlight(InFlight* out) const {
  bool any = false;
  for (const Slot& s : slots_) {
    uint64_t t = s.token.load(std::memory_order_acquire);
    if (!t) continue;
    int64_t start = s.start_ns.load(std::memory_order_relaxed);
    if (!any || start < out->start_ns) {
      out->record_id = t - 1;
      out->start_ns = start;
      // A vendor library tells us no finer progress than a hierarchical op's phase changes.
      out->last_progress_ns = std::max(start, s.phase_ns.load(std::memory_order_relaxed));
      out->waiting_on.clear();
      out->waits.clear();
      // A vendor library tells us nothing per peer; a point-to-point op names its one peer.
      uint8_t op = s.op.load(std::memory_order_relaxed);
      int peer = s.peer.load(std::memory_order_relaxed);
      if (isP2P(OpKind(op)) && peer >= 0 && size_t(peer) < global_.size()) {
        bool send = OpKind(op) == OpKind::kSend;
        out->waits.push_back(WaitedPeer{global_[size_t(peer)], send, 1, 0});
        out->waiting_on = strFormat("rank %d", global_[size_t(peer)]);
      }
      any = true;
    }
  }
  return any;
}

void ExternalComm::requestAbort(const std::string& why) {
  HETOBS_WARN("HETOBS_ABORT_ON_HANG cannot abort a %s op from outside; the hang stays recorded (%s)",
              backendName(backend_), why.c_str());
}

void ExternalComm::writeMetadata(JsonWriter& w) const {
  w.beginObject();
  w.field("comm_id", id_).field("size", size()).field("rank", rank_).field("backend", backendName(backend_));
  w.field("name", name_);
  if (island_[0]) w.field("island", island_);  // so a rank that leaves no dump still has its island
  writeMembership(w, id_, global_, global_, true);
  w.key("transports").beginObject().endObject();
  w.endObject();
}

void ExternalComm::writePeers(JsonWriter& w, int64_t) const { w.beginArray().endArray(); }
void ExternalComm::writeLinks(JsonWriter& w) const { w.beginArray().endArray(); }

void ExternalComm::writeState(JsonWriter& w, int64_t nowMono) const {
  w.beginObject();
  w.field("comm_id", id_).field("size", size()).field("rank", rank_).field("backend", backendName(backend_));
  w.field("name", name_);
  writeMembership(w, id_, global_, global_, false);
  if (island_[0]) w.field("island", island_);
  w.field("last_coll_seq", collSeq_.load()).field("last_p2p_seq", p2pSeq_.load());
  w.field("failed", cstats_ && __atomic_load_n(&cstats_->failed, __ATOMIC_RELAXED) != 0).nullField("cause");
  w.nullField("abort");  // no abort notices outside the native transport
  w.nullField("cause_info");
  InFlight f;
  OpRecord r{};
  if (inFlight(&f) && Recorder::instance().get(f.record_id, &r)) {
    w.key("in_flight").beginObject();
    writeInFlightFields(w, r, f.start_ns, nowMono);
    const Slot* s = slotOf(f.record_id + 1);
    auto phase = IslandPhase(s ? s->phase.load(std::memory_order_relaxed) : 0);
    if (island_[0] || phase != IslandPhase::kNone) w.field("phase", islandPhaseName(phase));
    w.key("peers");
    writePeers(w, nowMono);
    writeWaitingOn(w, f.waits);
    w.endObject();
  } else {
    w.nullField("in_flight");
  }
  w.key("links");
  writeLinks(w);
  w.endObject();
}

}  // namespace hetobs
