#include "nccl_state.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "hetobs/bootstrap/card.h"
#include "hetobs/bootstrap/listener.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"
#include "hetobs/stats/segment.h"
#include "op_watch.h"

namespace hetobs {
namespace nccl {
namespace {

// ------------------------------------------------------------------ real symbols

// A libnccl already in the process (for symbols RTLD_NEXT cannot see, e.g. a libnccl
// loaded with RTLD_LOCAL by something else). Not cached while there is none.
void* ncclLibrary() {
  static std::atomic<void*> lib{nullptr};
  void* h = lib.load(std::memory_order_acquire);
  if (h) return h;
  h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_NOLOAD);
  if (h) lib.store(h, std::memory_order_release);
  return h;
}

// ------------------------------------------------------------------ world from the environment

bool envInt(const char* name, int* out) {
  const char* v = getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  if (*end || x < 0 || x > (1 << 30)) return false;
  *out = int(x);
  return true;
}

bool worldFromEnv(int* rank, int* size) {
  static const char* kPairs[][2] = {
      {"RANK", "WORLD_SIZE"},                                // torchrun, hetobs run
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},      // Open MPI
      {"PMI_RANK", "PMI_SIZE"},                              // MPICH / Hydra
      {"SLURM_PROCID", "SLURM_NTASKS"},                      // srun
  };
  for (auto& p : kPairs) {
    int r, s;
    if (envInt(p[0], &r) && envInt(p[1], &s) && s > 0 && r < s) {
      *rank = r;
      *size = s;
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------------ side channel

// Minimal readers for the rank files our own JsonWriter wrote (compact, known keys).
bool jsonString(const std::string& s, size_t from, const char* key, std::string* out) {
  std::string k = std::string("\"") + key + "\":\"";
  size_t at = s.find(k, from);
  if (at == std::string::npos) return false;
  size_t b = at + k.size(), e = b;
  while (e < s.size() && s[e] != '"') e += s[e] == '\\' ? 2 : 1;
  if (e >= s.size()) return false;
  *out = s.substr(b, e - b);
  return true;
}
bool jsonInt(const std::string& s, size_t from, const char* key, long long* out) {
  std::string k = std::string("\"") + key + "\":";
  size_t at = s.find(k, from);
  if (at == std::string::npos) return false;
  char* end = nullptr;
  *out = strtoll(s.c_str() + at + k.size(), &end, 10);
  return end != s.c_str() + at + k.size();
}

// A rank's card from its rank file; only from a process that has not exited and that
// started no earlier than `notBeforeNs` (wall clock): a file left by an earlier run of the
// same job id (a requeued job) is not taken for the rank's current address.
bool readCard(const std::string& path, int rank, int64_t notBeforeNs, Card* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  long long started = 0;
  if (s.find("\"exited_cleanly\":false") == std::string::npos || !jsonInt(s, 0, "start_time_ns", &started) ||
      started < notBeforeNs)
    return false;
  size_t sc = s.find("\"side_channel\":{");
  long long port = 0, pid = 0, r = -1;
  Card c;
  if (sc == std::string::npos || !jsonString(s, sc, "ip", &c.ip) || !jsonInt(s, sc, "port", &port) || port <= 0 ||
      port > 65535 || !jsonInt(s, 0, "rank", &r) || r != rank)
    return false;
  jsonInt(s, 0, "pid", &pid);
  jsonString(s, 0, "host", &c.hostname);
  jsonString(s, 0, "host_key", &c.host_key);
  c.rank = rank;
  c.pid = int(pid);
  c.port = int(port);
  *out = c;
  return true;
}

// Peers' cards come from their rank files in the (shared) job directory: no rendezvous
// server, no port of anyone else's to borrow, and nothing depends on one rank. Until a
// peer's file is there its card is a placeholder (asking it fails fast as unanswered).
void discoverWorld(Process* p, Card me, int64_t myStartWallNs) {
  std::vector<Card> cards(size_t(p->size));
  for (int r = 0; r < p->size; ++r) cards[size_t(r)].rank = r;
  cards[size_t(me.rank)] = me;
  std::vector<char> found(size_t(p->size), 0);
  found[size_t(me.rank)] = 1;
  int missing = p->size - 1;
  const int64_t start = monoNs();
  const int64_t fastUntil = deadlineAfter(start, p->env.connect_timeout);
  const int64_t giveUp = deadlineAfter(fastUntil, 600);
  // Ranks of one launch start within the connect timeout of each other (give them 5 more minutes).
  const int64_t notBefore = myStartWallNs - std::min(secondsToNs(p->env.connect_timeout + 300), myStartWallNs);
  int64_t sleepMs = 100;
  while (missing > 0 && monoNs() < giveUp) {
    bool changed = false;
    for (int r = 0; r < p->size; ++r) {
      if (found[size_t(r)]) continue;
      Card c;
      if (readCard(p->rt->jobDir().rankFile(r), r, notBefore, &c)) {
        cards[size_t(r)] = c;
        found[size_t(r)] = 1;
        --missing;
        changed = true;
      }
    }
    if (changed) {
      std::lock_guard<std::mutex> g(p->metaMu);
      p->rt->setWorld(cards);
    }
    if (missing == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
    sleepMs = monoNs() < fastUntil ? std::min<int64_t>(sleepMs * 2, 2000) : 10000;
  }
  if (missing > 0)
    HETOBS_WARN("NCCL interposer: %d rank(s) never wrote their side-channel address to %s; dump requests to them "
                "fail (is HETOBS_DIR shared between hosts?)",
                missing, p->rt->jobDir().path().c_str());
}

void startSideChannel(Process* p) {
  try {
    Credentials cred{p->env.job_id, p->env.secret.empty() ? p->env.job_id : p->env.secret};
    // Bound where peers are told to dial it, not on every interface (HETOBS_SOCKET_IFNAME first).
    std::string ip = p->size <= 1 ? std::string("127.0.0.1") : advertisedAddressFromEnv();
    p->listener = std::make_unique<Listener>(cred, ip);
    Runtime* rt = p->rt;
    p->listener->setControlHandler([rt](const std::string& req) { return rt->handleControl(req); });
    Card me;
    me.rank = p->rank;
    me.pid = int(getpid());
    me.host_key = localHostKey();
    me.hostname = localHostname();
    me.ip = ip;
    me.port = p->listener->port();
    std::vector<Card> cards(size_t(p->size));
    for (int r = 0; r < p->size; ++r) cards[size_t(r)].rank = r;
    cards[size_t(p->rank)] = me;
    {
      std::lock_guard<std::mutex> g(p->metaMu);
      rt->setWorld(cards);
    }
    if (p->size > 1 && !p->env.job_id_generated) {
      std::thread(discoverWorld, p, me, wallNs()).detach();
    } else if (p->size > 1) {
      HETOBS_INFO("NCCL interposer: no job id set (HETOBS_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID): this rank is "
                  "its own job %s and cannot reach the others' side channels",
                  p->env.job_id.c_str());
    }
  } catch (const std::exception& e) {
    HETOBS_WARN("NCCL interposer: no side channel (%s); dumps still work on this rank", e.what());
  }
}

// ------------------------------------------------------------------ process start / exit

std::mutex gStartMu;
std::atomic<Process*> gProcess{nullptr};
std::atomic<bool> gDisabled{false};
pid_t gStartPid = 0;

// Another hetobs runtime in this very process (the MPI interposer, or hetobs in Python)
// already owns this rank's stats segment: a second one would clobber it.
bool segmentTakenByThisProcess(const std::string& job, int rank) {
  std::string path = "/dev/shm" + stats::Segment::pathFor(job, rank);
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return false;
  stats::StatsHeader h;
  size_t n = fread(&h, 1, sizeof h, f);
  fclose(f);
  return n == sizeof h && memcmp(h.magic, stats::kMagic, sizeof h.magic) == 0 && h.pid == int32_t(getpid());
}

void onExit() {
  Process* p = gProcess.load(std::memory_order_acquire);
  if (!p || getpid() != gStartPid) return;  // a forked child exiting is not this rank's exit
  bool idle = stopWatching();
  Drops& d = drops();
  if (d.slotsFull || d.captured || d.profilerEvents)
    HETOBS_INFO("NCCL interposer: not recorded: %llu op(s) over the in-flight limit, %llu graph-captured op(s), "
                "%llu profiler event(s)",
                (unsigned long long)d.slotsFull.load(), (unsigned long long)d.captured.load(),
                (unsigned long long)d.profilerEvents.load());
  std::lock_guard<std::mutex> g(p->metaMu);
  p->rt->markExit(idle && !d.opsFailed.load());
}

// ------------------------------------------------------------------ registry

constexpr size_t kCommCap = 4096;
struct Registry {
  std::atomic<ncclComm_t> keys[kCommCap];
  std::shared_ptr<NcclComm> vals[kCommCap];
  std::mutex mu;
  std::vector<std::weak_ptr<NcclComm>> unbound;
};
Registry& registry() {
  static Registry* r = new Registry();  // leaked: read until the very end
  return *r;
}
ncclComm_t const kTombstone = reinterpret_cast<ncclComm_t>(uintptr_t(1));
size_t slotOf(ncclComm_t h) { return (uintptr_t(h) >> 4) * 0x9E3779B97F4A7C15ull >> 52 & (kCommCap - 1); }

}  // namespace

void* realSymbol(const char* name, std::atomic<void*>& cache) {
  void* f = cache.load(std::memory_order_acquire);
  if (f) return f;
  f = dlsym(RTLD_NEXT, name);
  if (!f && ncclLibrary()) f = dlsym(ncclLibrary(), name);
  if (f) cache.store(f, std::memory_order_release);
  return f;
}

const char* ncclErrorString(ncclResult_t r) {
  auto fn = HETOBS_REAL(ncclGetErrorString, const char* (*)(ncclResult_t));
  if (fn) return fn(r);
  return "NCCL error";
}

Drops& drops() {
  static Drops* d = new Drops();
  return *d;
}

ThreadHint& threadHint() {
  static thread_local ThreadHint h;
  return h;
}

Process* process() { return gProcess.load(std::memory_order_acquire); }
bool processDisabled() { return gDisabled.load(std::memory_order_relaxed); }

Process* startProcess(int hintRank, int hintSize) {
  if (Process* p = gProcess.load(std::memory_order_acquire)) return p;
  if (gDisabled.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> g(gStartMu);
  if (Process* p = gProcess.load()) return p;
  if (gDisabled.load()) return nullptr;
  auto* p = new Process();  // leaked on purpose, like the runtime
  std::string error;
  if (!readEnvSettings(&p->env, &error)) {
    fprintf(stderr, "hetobs: NCCL interposer disabled: %s\n", error.c_str());
    gDisabled = true;
    delete p;
    return nullptr;
  }
  applyLogLevel(p->env);
  // No id set (torchrun's static rendezvous says TORCHELASTIC_RUN_ID=none): NCCL hands us no
  // channel to agree on rank 0's, so derive one all ranks of this launch share.
  if (p->env.job_id_generated && launchJobId(&p->env.job_id)) p->env.job_id_generated = false;
  if (!p->env.watchdog) {
    gDisabled = true;  // HETOBS_WATCHDOG=0: no stats, no dumps, nothing to record into
    delete p;
    return nullptr;
  }
  p->worldFromEnv = worldFromEnv(&p->rank, &p->size);
  if (!p->worldFromEnv && hintSize > 0 && hintRank >= 0 && hintRank < hintSize) {
    p->rank = hintRank;
    p->size = hintSize;
  }
  setLogPrefix("rank " + std::to_string(p->rank));
  if (segmentTakenByThisProcess(p->env.job_id, p->rank)) {
    HETOBS_WARN("NCCL interposer off: another hetobs runtime already watches this process (the MPI interposer, "
                "or hetobs in Python); preload one hetobs library per process");
    gDisabled = true;
    delete p;
    return nullptr;
  }
  try {
    p->rt = &Runtime::init(runtimeConfigFrom(p->env, p->rank, p->size));
  } catch (const std::exception& e) {
    HETOBS_WARN("NCCL interposer disabled: cannot start the runtime: %s", e.what());
    gDisabled = true;
    delete p;
    return nullptr;
  }
  startSideChannel(p);
  gStartPid = getpid();
  atexit(onExit);
  gProcess.store(p, std::memory_order_release);
  HETOBS_INFO("NCCL interposer active: job %s, rank %d of %d%s", p->env.job_id.c_str(), p->rank, p->size,
              p->worldFromEnv ? "" : " (from the first communicator)");
  return p;
}

uint64_t commIdFrom(const void* bytes, size_t n, uint64_t salt) {
  uint64_t h = 1469598103934665603ull ^ salt;
  const auto* b = static_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  h ^= h >> 29;
  uint64_t id = h & ((1ull << 53) - 1);
  if (id == 0 || id == (1ull << 52)) id = 2;  // 0: the native world; 1 << 52: the torch wrapper's world
  return id;
}

std::vector<int> globalRanksFor(const Process& p, int rank, int size, bool* known) {
  std::vector<int> g(static_cast<size_t>(size));
  *known = true;
  if (size == p.size && rank == p.rank) {
    for (int i = 0; i < size; ++i) g[size_t(i)] = i;
  } else if (size == 1) {
    g[0] = p.rank;
  } else {
    *known = false;
    for (int i = 0; i < size; ++i) g[size_t(i)] = i;
  }
  return g;
}

std::shared_ptr<NcclComm> makeComm(Process& p, uint64_t id, int rank, int size, int device, bool attach) {
  bool known = true;
  auto g = globalRanksFor(p, rank, size, &known);
  if (!known)
    HETOBS_INFO("NCCL comm %llu (%d ranks) does not span the world of %d: its peers are named by comm rank",
                (unsigned long long)id, size, p.size);
  auto c = std::make_shared<NcclComm>(id, std::move(g), rank, device, strFormat("nccl:%llx", (unsigned long long)id));
  if (attach) attachComm(*c);
  return c;
}

void attachComm(NcclComm& comm) {
  Process* p = process();
  if (!p) return;
  std::lock_guard<std::mutex> g(p->metaMu);
  comm.attach();
}

std::shared_ptr<NcclComm> findComm(ncclComm_t h) {
  if (!h) return nullptr;
  Registry& r = registry();
  size_t i = slotOf(h);
  for (size_t n = 0; n < kCommCap; ++n, i = (i + 1) & (kCommCap - 1)) {
    ncclComm_t k = r.keys[i].load(std::memory_order_acquire);
    if (k == h) return r.vals[i];
    if (k == nullptr) return nullptr;
  }
  return nullptr;
}

void addComm(ncclComm_t h, const std::shared_ptr<NcclComm>& comm) {
  if (!h) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  comm->handle.store(h);
  size_t i = slotOf(h), free = kCommCap;
  for (size_t n = 0; n < kCommCap; ++n, i = (i + 1) & (kCommCap - 1)) {
    ncclComm_t k = r.keys[i].load(std::memory_order_relaxed);
    if (k == h) {  // a handle NCCL reused after a destroy we did not see
      r.vals[i] = comm;
      return;
    }
    if (k == kTombstone && free == kCommCap) free = i;
    if (k == nullptr) {
      if (free == kCommCap) free = i;
      break;
    }
  }
  if (free == kCommCap) {
    HETOBS_WARN("NCCL interposer: more than %zu communicators; ops of the new one are not recorded", kCommCap);
    return;
  }
  r.vals[free] = comm;
  r.keys[free].store(h, std::memory_order_release);
}

void removeComm(ncclComm_t h) {
  if (!h) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  size_t i = slotOf(h);
  for (size_t n = 0; n < kCommCap; ++n, i = (i + 1) & (kCommCap - 1)) {
    ncclComm_t k = r.keys[i].load(std::memory_order_relaxed);
    if (k == nullptr) return;
    if (k == h) {
      r.keys[i].store(kTombstone, std::memory_order_release);
      r.vals[i].reset();
      return;
    }
  }
}

std::shared_ptr<NcclComm> adoptComm(ncclComm_t h) {
  auto count = HETOBS_REAL(ncclCommCount, ncclResult_t (*)(ncclComm_t, int*));
  auto userRank = HETOBS_REAL(ncclCommUserRank, ncclResult_t (*)(ncclComm_t, int*));
  auto cuDevice = HETOBS_REAL(ncclCommCuDevice, ncclResult_t (*)(ncclComm_t, int*));
  int size = 0, rank = -1, dev = -1;
  if (!count || !userRank || count(h, &size) != ncclSuccess || userRank(h, &rank) != ncclSuccess || size <= 0 ||
      rank < 0 || rank >= size)
    return nullptr;
  if (cuDevice && cuDevice(h, &dev) != ncclSuccess) dev = -1;
  Process* p = startProcess(rank, size);
  if (!p) return nullptr;
  static std::mutex adoptMu;  // two threads adopting the same comm: one makes it
  std::lock_guard<std::mutex> g(adoptMu);
  if (auto c = findComm(h)) return c;
  uintptr_t key[2] = {uintptr_t(h), uintptr_t(getpid())};
  auto c = makeComm(*p, commIdFrom(key, sizeof key, 0xad0b7), rank, size, dev);
  HETOBS_INFO("NCCL comm %p was created outside the interposed calls: recorded as comm %llu, an id other ranks "
              "do not share",
              static_cast<void*>(h), (unsigned long long)c->id());
  addComm(h, c);
  noteUnbound(c);
  return findComm(h);
}

void noteUnbound(const std::shared_ptr<NcclComm>& comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  for (auto it = r.unbound.begin(); it != r.unbound.end();) {  // (without a plugin nobody else prunes)
    auto c = it->lock();
    it = (!c || c->profilerBound.load()) ? r.unbound.erase(it) : it + 1;
  }
  r.unbound.push_back(comm);
}

std::vector<std::shared_ptr<NcclComm>> unboundComms() {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<std::shared_ptr<NcclComm>> out;
  for (auto it = r.unbound.begin(); it != r.unbound.end();) {
    auto c = it->lock();
    if (!c || c->profilerBound.load()) {
      it = r.unbound.erase(it);
      continue;
    }
    out.push_back(std::move(c));
    ++it;
  }
  return out;
}

}  // namespace nccl
}  // namespace hetobs
