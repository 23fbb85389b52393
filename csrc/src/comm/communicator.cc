#include "hetobs/comm/communicator.h"

#include <algorithm>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/collectives/digest.h"
#include "hetobs/common/env_config.h"
#include "hetobs/comm/endpoint.h"
#include "hetobs/observe/data_mismatch.h"
#include "hetobs/observe/op_scope.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/observe/state_json.h"
#include "hetobs/record/arrival.h"
#include "hetobs/stats/op_stats.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/record/recorder.h"
#include "hetobs/relay/relay_state.h"
#include "hetobs/transport/shm/segment.h"

namespace hetobs {
namespace {

// splitmix64: a child's id from (parent, split number, color), equal on every member.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

Communicator::Communicator(std::shared_ptr<Endpoint> endpoint, uint64_t id, std::vector<int> globalRanks, int rank)
    : endpoint_(std::move(endpoint)), id_(id), global_(std::move(globalRanks)), rank_(rank) {
  // Both kernel clocks, read side by side: the offset errs by well under a microsecond and is the
  // same for every process of a host (unless the wall clock is stepped between their starts).
  const int64_t m0 = systemMonoNs(), w = wallNs(), m1 = systemMonoNs();
  wallMinusSysMonoNs_ = w - (m0 + m1) / 2;
  const DigestSettings& ds = digestSettings();
  digestOn_ = ds.on;
  flipArmed_ = ds.flip_seq >= 0;
  sendSeq_.assign(global_.size(), 0);
  recvSeq_.assign(global_.size(), 0);
  relaySeq_.assign(global_.size(), 0);
  relayPeerSeq_.assign(global_.size(), 0);
}

Communicator::~Communicator() {
  try {
    close();
  } catch (...) {
  }
}

const CommConfig& Communicator::config() const { return endpoint_->config(); }
size_t Communicator::smallBytes() const { return endpoint_->config().small_bytes; }

void Communicator::connect() {
  buildChannels();
  epoll_.open(channels_.size());
  allConnected_ = std::count_if(channels_.begin(), channels_.end(), [](const auto& ch) { return ch != nullptr; }) ==
                  size() - 1;
  Runtime* rt = Runtime::get();
  cstats_ = Runtime::commStats(&ownStats_, id_, size(), rank_);
  scope_.bind(cstats_, OpScope::Writers::kOne);
  for (auto& ch : channels_)
    if (ch) {
      ch->bindStats(rt ? rt->stats().allocLink() : nullptr, id_);
      ch->bindArrival(&arrival_);
    }
  if (rt) rt->registerComm(shared_from_this());
}

void Communicator::statsEnd(const OpDesc& d, uint64_t bytes, int64_t startMono, int64_t endMono, bool ok,
                            const ArrivalInfo* arrival) {
  inflightRecord_.store(0, std::memory_order_release);
  const int me = worldRanks()[size_t(rank_)];
  scope_.ended(uint8_t(d.op), bytes, endMono - startMono, endMono, ok, busBwFactor(uint8_t(d.op), size()), true,
               [&](stats::CommStats& c, auto add, auto set) {
                 if (!arrival || !(arrival->flags & kArrivalJudged)) return;
                 add(c.arrivals_judged, 1);
                 set(c.last_arrival_rank, arrival->last_rank);
                 set(c.last_arrival_lag_ns, arrival->lag_ns);
                 if (arrival->last_rank == me) {  // each op counted once job-wide: by its last rank
                   add(c.last_arrivals, 1);
                   add(c.arrival_lag_total_ns, uint64_t(arrival->lag_ns));
                   add(c.arrival_lag[stats::log2Bucket(uint64_t(arrival->lag_ns) / 1000, stats::kLagBuckets)], 1);
                 }
               });
}

bool Communicator::inFlight(InFlight* out) const {
  std::lock_guard<std::mutex> g(observeMu_);
  return inFlightLocked(out);
}

bool Communicator::inFlightLocked(InFlight* out) const {
  uint64_t r = inflightRecord_.load(std::memory_order_acquire);
  if (r == 0) return false;
  out->record_id = r - 1;
  out->start_ns = inflightStart_.load(std::memory_order_relaxed);
  out->last_progress_ns = out->start_ns;
  out->waiting_on.clear();
  out->waits.clear();
  for (const auto& ch : channels_) {
    if (!ch) continue;
    auto& p = const_cast<Channel&>(*ch).progress();
    int64_t t = p.last_change_ns.load(std::memory_order_relaxed);
    if (t > out->last_progress_ns) out->last_progress_ns = t;
    size_t before = out->waits.size();
    addWaits(&out->waits, worldRanks()[size_t(ch->peer().rank)], p);
    if (out->waits.size() > before) out->waiting_on += (out->waiting_on.empty() ? "" : ", ") + ch->peer().describe();
  }
  return true;
}

void Communicator::requestAbort(const std::string& why) {
  abortWhy_ = why;
  abortRequested_.store(true, std::memory_order_release);
}

void Communicator::reportFailure(const std::string& msg, uint64_t seq) {
  Runtime* rt = Runtime::get();
  if (!rt) return;
  DumpRequest req;
  req.incident = strFormat("error-c%llu-%s%llu", (unsigned long long)id_, isP2P(desc_.op) ? "p" : "s",
                           (unsigned long long)seq);
  if (isP2P(desc_.op)) req.incident += "-r" + std::to_string(global_[size_t(rank_)]);
  req.reason = "error";
  req.cause = msg;
  req.cause_info = causeInfo(seq);
  req.ask_peers = true;
  if (failure_.gonePeer >= 0) req.known_gone.push_back(global_[size_t(failure_.gonePeer)]);
  rt->dump(req);
}

RelayState& Communicator::relayState() {
  if (!relay_) {
    Doorbell* bell = segment_ ? &segment_->header()->bell : nullptr;
    relay_ = std::make_unique<RelayState>(size(), [bell] {
      if (bell) bell->ring();  // the op thread may sleep on its shared-memory doorbell
    });
    relayLive_.store(relay_.get(), std::memory_order_release);
  }
  return *relay_;
}

uint8_t* Communicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

std::string Communicator::opContext() const {
  return strFormat("%s on comm %llu failed at rank %d", desc_.str().c_str(), (unsigned long long)id_, rank_);
}

std::shared_ptr<Work> Communicator::submit(const OpArgs& args, bool async) {
  if (closed_.load()) throw Error(strFormat("communicator %llu is closed", (unsigned long long)id_));
  if (failure_.failed.load())
    throw AbortedError(strFormat("communicator %llu is unusable after an earlier failure: %s",
                                 (unsigned long long)id_, failure_.cause.c_str()));
  // A blocking op starts as it is enqueued: one clock read for both (~30 ns each here).
  auto runHere = [&] {
    std::lock_guard<std::mutex> ex(execMu_);
    int64_t now = monoNs();
    execute(args, now, now, systemMonoNs());
  };
  // A blocking op with nothing queued runs without the queue's lock: pending_ only grows
  // under it, and this thread's own earlier async ops were counted before they returned.
  if (!async && pending_.load(std::memory_order_acquire) == 0) {
    runHere();
    return nullptr;
  }
  std::unique_lock<std::mutex> lk(qmu_);
  if (async || pending_ > 0) {
    if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
    auto w = std::make_shared<Work>();
    queue_.push_back(Task{args, monoNs(), w, systemMonoNs()});
    ++pending_;
    qcv_.notify_all();
    lk.unlock();
    if (async) return w;
    w->wait(-1);
    return nullptr;
  }
  lk.unlock();
  runHere();
  return nullptr;
}

void Communicator::workerLoop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lk(qmu_);
      qcv_.wait(lk, [&] { return stopWorker_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    try {
      std::lock_guard<std::mutex> ex(execMu_);
      if (failure_.failed.load())
        throw AbortedError(strFormat("communicator %llu is unusable after an earlier failure: %s",
                                     (unsigned long long)id_, failure_.cause.c_str()));
      execute(task.args, task.enqueue_ns, monoNs(), task.entry_sys_ns);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(qmu_);
      --pending_;
    }
    task.work->finish(err);
  }
}

void Communicator::execute(const OpArgs& a, int64_t enqueueNs, int64_t start, int64_t entrySysNs) {
  // Describe the op as every peer must see it.
  OpDesc d;
  d.comm_tag = uint32_t(id_);
  d.op = a.op;
  d.dtype = a.dtype;
  d.redop = a.redop;
  bool p2p = isP2P(a.op);
  uint64_t p2pSeq = 0;
  if (a.op == OpKind::kRelay) {
    // Frames to each peer carry the count of relays shared with it (descFor); the op's
    // own seq is this rank's p2p op number, as its record says.
    for (const auto* list : {&a.relay->sends, &a.relay->recvs})
      for (const RelayMessage& m : *list) relayPeerSeq_[size_t(m.peer)] = 0;
    for (const auto* list : {&a.relay->sends, &a.relay->recvs})
      for (const RelayMessage& m : *list)
        if (relayPeerSeq_[size_t(m.peer)] == 0) relayPeerSeq_[size_t(m.peer)] = ++relaySeq_[size_t(m.peer)];
    d.dtype = DType::kUint8;
    d.redop = RedOp::kSum;
    d.root = 0;
    d.count = 0;
    p2pSeq = ++p2pSeq_;
    d.seq = p2pSeq;
  } else if (p2p) {
    int peer = a.root_or_peer;
    d.root = a.op == OpKind::kSend ? rank_ : peer;  // the sending rank, on both sides
    d.seq = a.op == OpKind::kSend ? sendSeq_[size_t(peer)]++ : recvSeq_[size_t(peer)]++;
    d.count = a.op == OpKind::kSend ? a.send_count : a.recv_count;
    p2pSeq = ++p2pSeq_;
  } else {
    d.root = (a.op == OpKind::kBroadcast || a.op == OpKind::kReduce) ? a.root_or_peer : 0;
    d.seq = ++collSeq_;
    d.count = a.op == OpKind::kBarrier ? 0 : a.send_count;
  }
  desc_ = d;
  if (!p2p) history_[d.seq % kHistory] = d;
  double timeout = a.timeout_s >= 0 ? a.timeout_s : config().timeout_s;

  OpRecord rec{};
  rec.comm_id = id_;
  rec.coll_seq = p2p ? 0 : d.seq;
  rec.p2p_seq = p2pSeq;
  rec.count = a.send_count;
  rec.out_count = a.recv_count;
  rec.bytes = opBytes(a, size());
  rec.t_enqueue_ns = enqueueNs;
  rec.root_or_peer = (p2p || a.op == OpKind::kBroadcast || a.op == OpKind::kReduce) ? a.root_or_peer : -1;
  if (a.op == OpKind::kRelay)  // its first peer (a relay may have several)
    rec.root_or_peer = !a.relay->sends.empty() ? a.relay->sends[0].peer
                       : !a.relay->recvs.empty() ? a.relay->recvs[0].peer : -1;
  rec.comm_size = size();
  rec.comm_rank = rank_;
  rec.op = uint8_t(a.op);
  rec.dtype = uint8_t(a.dtype);
  rec.redop = uint8_t(a.redop);
  rec.state = uint8_t(OpState::kStarted);
  rec.algorithm = uint8_t(chooseAlgorithm(*this, a));
  rec.backend = uint8_t(Backend::kNative);
  rec.device_type = uint8_t(DeviceType::kCpu);
  if (a.op == OpKind::kRelay && a.relay->stage == RelayStage::kCuda) {
    rec.device_type = uint8_t(DeviceType::kCuda);
  } else if (a.op == OpKind::kRelay && a.relay->stage == RelayStage::kDevice) {
    rec.device_type = uint8_t(DeviceType::kOther);
    setName(rec.device, deviceTypeNameOf(a.relay->device_type).c_str());
  }
  rec.t_start_ns = start;
  // Who arrives last: this rank's entry (when the caller called: an async op may start later,
  // behind earlier ones) goes out in every data frame the op sends (record/arrival.h).
  const bool arrivals = !p2p && size() > 1 && size() <= arrival::kMaxRanks;
  entryUs_ = arrivals ? uint64_t((entrySysNs + wallMinusSysMonoNs_) / 1000) : 0;
  arrival_ = arrivals ? arrival::make(rank_, entryUs_, 0) : 0;
  Recorder& recorder = Recorder::instance();
  uint64_t rid = scope_.begin(rec);
  DigestVerdict digest;
  bool corrupt = false;
  for (auto& ch : channels_)
    if (ch) ch->progress().reset();
  inflightStart_.store(start, std::memory_order_relaxed);  // the watchdog's view (inFlight): after the reset
  inflightRecord_.store(rid + 1, std::memory_order_release);
  opStartNs_ = start;
  deadlineNs_ = deadlineAfter(start, timeout);
  try {
    if (!allConnected_) {
      if (neededPeers(*this, a, &neededScratch_)) {
        neededScratch_.clear();
        for (int p = 0; p < size(); ++p) neededScratch_.push_back(p);
        ensureChannels(neededScratch_);
        allConnected_ = true;
      } else {
        ensureChannels(neededScratch_);
      }
    }
    // A peer announced a mismatch at this seq while the op before it still ran here.
    if (!failure_.deferredMismatch.empty()) throw failure_.deferredMismatch.front();
    runCollective(*this, a);
    if (__builtin_expect(digestOn_ || flipArmed_, 0) && !p2p) corrupt = checkResult(a, &digest);
  } catch (...) {
    std::exception_ptr ep = std::current_exception();
    std::string what = "failed";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    }
    int64_t end = monoNs();
    recorder.markFinished(rid, end, false, what.c_str());
    statsEnd(d, rec.bytes, start, end, false);
    handleFailure(ep);
  }
  int64_t end = monoNs();
  ArrivalInfo arrived;
  if (arrivals) judgeArrival(a, &arrived);
  if (corrupt) {
    // The op finished (the transport is sound), but ranks' results differ: told after the dump.
    std::vector<int> ranks;
    std::string msg = reportDataMismatch(digest, &ranks);
    if (digestSettings().raise) {
      recorder.markFinished(rid, end, false, msg.c_str(), nullptr, arrivals ? &arrived : nullptr);
      statsEnd(d, rec.bytes, start, end, true, arrivals ? &arrived : nullptr);
      throw DataMismatchError(msg, ranks, opName(d.op), id_, d.seq, digest.element);
    }
  }
  recorder.markFinished(rid, end, true, nullptr, nullptr, arrivals ? &arrived : nullptr);
  statsEnd(d, rec.bytes, start, end, true, arrivals ? &arrived : nullptr);
}

bool Communicator::checkResult(const OpArgs& a, DigestVerdict* out) {
  const DigestSettings& ds = digestSettings();
  if (flipArmed_ && uint64_t(ds.flip_seq) == desc_.seq)
    flipResultBit(a, ds.flip_element, ds.flip_bit);  // HETOBS_TEST_FLIP_BIT: test only
  if (!ds.on || size() < 2 || desc_.seq % ds.every != 0) return false;
  uint8_t* data = nullptr;
  size_t count = 0;
  if (!resultOf(a, &data, &count)) return false;
  bool differs = compareResults(*this, a, out);
  noteDigest(differs && std::find(out->differing.begin(), out->differing.end(), rank_) != out->differing.end());
  return differs;
}

void Communicator::noteDigest(bool mismatch) {
  scope_.update([&](stats::CommStats& c, auto add, auto) {
    add(c.digests_checked, 1);
    if (mismatch) add(c.data_mismatches, 1);
  });
}

std::string Communicator::reportDataMismatch(const DigestVerdict& v, std::vector<int>* worldRanksOut) {
  MismatchSite site;
  site.comm_id = id_;
  site.world = &worldRanks();
  site.rank = rank_;
  site.op = desc_.op;
  site.seq = desc_.seq;
  site.what = desc_.str();
  return hetobs::reportDataMismatch(v, site, worldRanksOut);
}

void Communicator::judgeArrival(const OpArgs& a, ArrivalInfo* out) const {
  const uint64_t w = arrival_;
  const int last = arrival::rankOf(w);
  if (!(w & arrival::kValid) || last >= size()) return;
  out->last_rank = worldRanks()[size_t(last)];
  // The ring and direct algorithms bring every rank's entry to every rank; a chain only downstream.
  const bool all = a.op != OpKind::kBroadcast && a.op != OpKind::kReduce;
  out->flags = kArrivalKnown | (all ? kArrivalJudged : 0);
  const int64_t spreadUs = int64_t(arrival::spreadOf(w));
  out->lag_ns = spreadUs * 1000;
  // Ours minus the first: ours minus the latest, plus the latest minus the first.
  const int64_t behind = arrival::diff(entryUs_ & arrival::kTimeMask, arrival::timeOf(w)) + spreadUs;
  out->behind_first_ns = (behind > 0 ? behind : 0) * 1000;
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  // Everyone shares (color, key) through an ordinary all_gather on this communicator.
  int64_t mine[2] = {color, key};
  std::vector<int64_t> all(size_t(size()) * 2);
  OpArgs a;
  a.op = OpKind::kAllGather;
  a.dtype = DType::kInt64;
  a.send = reinterpret_cast<const uint8_t*>(mine);
  a.send_count = 2;
  a.recv = reinterpret_cast<uint8_t*>(all.data());
  a.recv_count = all.size();
  submit(a, false);
  uint64_t splitNo = ++splitCount_;
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < size(); ++r)
    if (all[size_t(r) * 2] == color) members.emplace_back(all[size_t(r) * 2 + 1], r);
  std::sort(members.begin(), members.end());
  std::vector<int> global, world;
  int newRank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank_) newRank = int(i);
    global.push_back(global_[size_t(members[i].second)]);
    world.push_back(worldRanks()[size_t(members[i].second)]);
  }
  // 53 bits: ids stay exact in JSON readers (JavaScript, Grafana) and fit an int64.
  uint64_t id = mix(mix(id_ ^ mix(splitNo)) ^ uint64_t(color)) & ((1ULL << 53) - 1);
  if (id == 0) id = 1;  // 0 names the world
  auto child = std::make_shared<Communicator>(endpoint_, id, global, newRank);
  if (!world_.empty()) child->setWorldRanks(world);
  child->connect();
  return child;
}

std::vector<LinkInfo> Communicator::links() const {
  std::vector<LinkInfo> out;
  std::lock_guard<std::mutex> g(observeMu_);
  for (size_t i = 0; i < channels_.size(); ++i) {
    const auto& ch = channels_[i];
    if (!ch) continue;
    auto& c = const_cast<Channel&>(*ch);
    LinkInfo l;
    l.peer = int(i);
    l.global_peer = global_[i];
    l.host = ch->peer().host;
    l.pid = ch->peer().pid;
    l.transport = ch->kind();
    l.local_address = ch->localAddress();
    l.remote_address = ch->remoteAddress();
    auto& k = c.counters();
    l.bytes_sent = k.bytes_sent.load();
    l.bytes_recv = k.bytes_recv.load();
    l.frames_sent = k.frames_sent.load();
    l.frames_recv = k.frames_recv.load();
    l.busy_ns = k.busy_ns.load();
    l.last_activity_ns = k.last_activity_ns.load();
    l.reconnects = c.reconnects().load(std::memory_order_relaxed);
    l.single_copy_bytes = c.singleCopyBytes();
    l.push_bytes = c.pushBytes();
    l.sends_unacked_max = c.sendsUnackedMax();
    auto& p = c.progress();
    l.send_posted = p.send_posted.load();
    l.send_sent = p.send_sent.load();
    l.send_acked = p.send_acked.load();
    l.send_done = p.send_done.load();
    l.recv_posted = p.recv_posted.load();
    l.recv_received = p.recv_received.load();
    l.recv_done = p.recv_done.load();
    l.progress_change_ns = p.last_change_ns.load();
    c.sampleHealth();  // a reader of links() wants the kernel's state now, not a second ago
    l.health = LinkHealthSnapshot::of(c.health());
    out.push_back(l);
  }
  return out;
}

void Communicator::sampleLinkHealth() const {
  std::lock_guard<std::mutex> g(observeMu_);  // close() may be taking the channels away
  for (const auto& ch : channels_)
    if (ch) ch->sampleHealth();
}

void Communicator::close() {
  if (closed_.exchange(true)) return;
  // From now on a peer whose link to us broke hears "closed" when it redials (or probes),
  // should the close message each channel sends below be lost with the connection.
  endpoint_->listener().markClosed(id_);
  {
    std::lock_guard<std::mutex> lk(qmu_);
    stopWorker_ = true;
    qcv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> ex(execMu_);
  std::unique_ptr<RelayState> relay;
  std::vector<std::unique_ptr<Channel>> channels;
  std::unique_ptr<shm::Segment> segment;
  {
    // Taken away under the observers' lock, destroyed after it: a dump in progress finishes
    // with the channels it is walking, the next one sees none.
    std::lock_guard<std::mutex> g(observeMu_);
    relayLive_.store(nullptr, std::memory_order_release);
    relay = std::move(relay_);
    channels.swap(channels_);
    segment = std::move(segment_);
  }
  relay.reset();  // joins the copy threads, which ring the segment's doorbell
  channels.clear();
  epoll_.close();
  segment.reset();
}

}  // namespace hetobs
