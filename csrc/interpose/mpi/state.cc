#include "state.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "hetobs/bootstrap/card.h"
#include "hetobs/bootstrap/listener.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"
#include "hetobs/observe/observed.h"
#include "hetobs/observe/runtime.h"

namespace hetobs {
namespace mpi {

std::atomic<bool> gActive{false};
CommEntry* gWorld = nullptr;

namespace {

std::mutex gMu;  // communicator creation/free, set-up, tear-down
Listener* gListener = nullptr;  // leaked: answers the side channel until the process ends

// Entries are never destroyed while the process runs (raw pointers to them sit in the
// communicator table); a freed communicator's entry only drops its ExternalComm.
std::vector<CommEntry*>& allEntries() {
  static auto* v = new std::vector<CommEntry*>();
  return *v;
}

// ---- communicator table: open addressing, keys never removed -------------------------
constexpr size_t kCommSlots = 4096;  // power of two
struct CommSlot {
  std::atomic<uint64_t> key{0};
  std::atomic<CommEntry*> entry{nullptr};
};
CommSlot gComms[kCommSlots];

bool putComm(uint64_t key, CommEntry* e) {  // under gMu
  if (key == 0) return false;
  size_t h = mixKey(key) & (kCommSlots - 1);
  for (size_t i = 0; i < kCommSlots; ++i) {
    CommSlot& s = gComms[(h + i) & (kCommSlots - 1)];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == key || k == 0) {
      s.entry.store(e, std::memory_order_release);
      if (k == 0) s.key.store(key, std::memory_order_release);
      return true;
    }
  }
  return false;
}

// ---- request table: open addressing, keys never removed ------------------------------
constexpr size_t kReqSlots = 16384;  // power of two
struct ReqSlot {
  std::atomic<uint64_t> key{0};
  std::atomic<uint64_t> token{0};
  std::atomic<ExternalComm*> comm{nullptr};
};
ReqSlot gReqs[kReqSlots];
constexpr size_t kMaxProbe = 64;

uint64_t fnv(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ULL;
  }
  return h;
}

void stderrLine(const std::string& s) {
  std::string line = "hetobs: " + s + "\n";
  ssize_t rc = write(2, line.data(), line.size());
  (void)rc;
}

CommEntry* newEntry(uint64_t id, std::vector<int> globals, int rank, const std::string& name) {
  auto ext = std::make_shared<ExternalComm>(id, std::move(globals), rank, Backend::kMpi, DeviceType::kCpu, name);
  ext->attach();
  auto* e = new CommEntry();
  e->ext = std::move(ext);
  e->x = e->ext.get();
  e->id = id;
  allEntries().push_back(e);
  return e;
}

}  // namespace

CommEntry* findComm(uint64_t key) {
  size_t h = mixKey(key) & (kCommSlots - 1);
  for (size_t i = 0; i < kCommSlots; ++i) {
    CommSlot& s = gComms[(h + i) & (kCommSlots - 1)];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == key) return s.entry.load(std::memory_order_acquire);
    if (k == 0) return nullptr;
  }
  return nullptr;
}

namespace {

constexpr uint64_t kFilling = ~0ull;  // a slot's token while its owner writes the entry

// Claim a free slot for `key` (one holding `key` with no op, or an empty one) and fill it.
// The same handle value may be live in several ops at once: MPI libraries hand out one
// static, already complete request for ops that finished inside the call (Open MPI does
// for small MPI_Isend), so a key can have several slots, each holding one op.
bool putRequest(uint64_t key, ExternalComm* comm, uint64_t token) {
  size_t h = mixKey(key) & (kReqSlots - 1);
  for (size_t i = 0; i < kMaxProbe; ++i) {
    ReqSlot& s = gReqs[(h + i) & (kReqSlots - 1)];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == 0) {
      uint64_t expected = 0;
      k = s.key.compare_exchange_strong(expected, key, std::memory_order_acq_rel) ? key : expected;
    }
    if (k != key) continue;
    uint64_t free = 0;
    if (!s.token.compare_exchange_strong(free, kFilling, std::memory_order_acq_rel)) continue;
    s.comm.store(comm, std::memory_order_relaxed);
    s.token.store(token, std::memory_order_release);
    return true;
  }
  return false;
}

// A request the table cannot hold: its op is ended now (recorded, completion time = issue
// time); an idup's communicator stays unwatched.
void untracked(ExternalComm* comm, uint64_t token) {
  if (comm == kIdupRequest) finishIdup(token, false);
  else comm->end(token, true);
}

}  // namespace

void trackRequest(MPI_Request req, ExternalComm* comm, uint64_t token) {
  uint64_t key = handleKey(req);
  if (key != 0 && key != handleKey(MPI_REQUEST_NULL) && putRequest(key, comm, token)) return;
  untracked(comm, token);
}

bool takeRequest(MPI_Request req, Pending* out) {
  uint64_t key = handleKey(req);
  if (key == 0) return false;
  size_t h = mixKey(key) & (kReqSlots - 1);
  for (size_t i = 0; i < kMaxProbe; ++i) {
    ReqSlot& s = gReqs[(h + i) & (kReqSlots - 1)];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == 0) return false;
    if (k != key) continue;
    uint64_t t = s.token.load(std::memory_order_acquire);
    // Several slots of one key (a shared, already complete request): any of its ops will
    // do, they are all done. A slot being filled belongs to an op not yet returned to
    // its caller, so it cannot be the one completing here.
    while (t != 0 && t != kFilling) {
      ExternalComm* c = s.comm.load(std::memory_order_relaxed);
      if (s.token.compare_exchange_weak(t, 0, std::memory_order_acq_rel)) {
        out->key = key;
        out->token = t;
        out->comm = c;
        return true;
      }
    }
  }
  return false;
}

void untakeRequest(const Pending& p) {
  if (!putRequest(p.key, p.comm, p.token)) untracked(p.comm, p.token);
}

TypeInfo typeInfo(MPI_Datatype t) {
  // Most frequent first. MPI_LONG is 64 bits on LP64 Linux.
  constexpr DType kLong = sizeof(long) == 8 ? DType::kInt64 : DType::kInt32;
  if (t == MPI_DOUBLE) return {DType::kFloat64, 8, true};
  if (t == MPI_FLOAT) return {DType::kFloat32, 4, true};
  if (t == MPI_INT) return {DType::kInt32, 4, true};
  if (t == MPI_LONG) return {kLong, sizeof(long), true};
  if (t == MPI_BYTE) return {DType::kUint8, 1, true};
  if (t == MPI_CHAR) return {DType::kInt8, 1, true};
  if (t == MPI_INT64_T) return {DType::kInt64, 8, true};
  if (t == MPI_LONG_LONG) return {DType::kInt64, 8, true};
  if (t == MPI_INT32_T) return {DType::kInt32, 4, true};
  if (t == MPI_UNSIGNED_CHAR) return {DType::kUint8, 1, true};
  if (t == MPI_UINT8_T) return {DType::kUint8, 1, true};
  if (t == MPI_INT8_T) return {DType::kInt8, 1, true};
  if (t == MPI_SIGNED_CHAR) return {DType::kInt8, 1, true};
  if (t == MPI_C_BOOL) return {DType::kUint8, 1, false};
  int size = 0;
  if (t == MPI_DATATYPE_NULL || PMPI_Type_size(t, &size) != MPI_SUCCESS || size < 0) size = 0;
  return {DType::kUint8, uint64_t(size), false};
}

RedOp redOpOf(MPI_Op op) {
  if (op == MPI_SUM) return RedOp::kSum;
  if (op == MPI_MAX) return RedOp::kMax;
  if (op == MPI_MIN) return RedOp::kMin;
  if (op == MPI_PROD) return RedOp::kProd;
  // Logical/bitwise/loc/user ops have no recorder code: "other" once the core has one
  // (appended after kAvg), until then the first code past the known ones.
  return RedOp(uint8_t(RedOp::kAvg) + 1);
}

namespace {

// Watch `child`, the `nth` child of the communicator `parentId` (0: count it per member
// set instead, for constructors only the members call).
void watchChild(uint64_t parentId, MPI_Comm child, const char* kind, int64_t salt, uint64_t nth) {
  if (child == MPI_COMM_NULL) return;
  int inter = 0;
  PMPI_Comm_test_inter(child, &inter);
  if (inter) return;  // intercommunicators are passed through unwatched
  int size = 0, rank = 0;
  PMPI_Comm_size(child, &size);
  PMPI_Comm_rank(child, &rank);
  MPI_Group g, wg;
  PMPI_Comm_group(child, &g);
  PMPI_Comm_group(MPI_COMM_WORLD, &wg);
  std::vector<int> local(static_cast<size_t>(size)), globals(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) local[size_t(i)] = i;
  PMPI_Group_translate_ranks(g, size, local.data(), wg, globals.data());
  PMPI_Group_free(&g);
  PMPI_Group_free(&wg);
  // Every member derives the same id: the parent's id, which child of it this is, how
  // it was made, and who is in it (disjoint siblings of one split differ by members).
  uint64_t h = 0xcbf29ce484222325ULL;
  h = fnv(h, parentId);
  for (const char* c = kind; *c; ++c) h = fnv(h, uint64_t(uint8_t(*c)));
  h = fnv(h, uint64_t(salt));
  for (int gr : globals) h = fnv(h, uint64_t(uint32_t(gr)));
  if (nth == 0) {
    // Only the members call it (MPI_Comm_create_group): count per (parent, members, tag).
    std::lock_guard<std::mutex> g1(gMu);
    static auto* counts = new std::map<uint64_t, uint64_t>();
    nth = ++(*counts)[h];
  }
  h = fnv(h, nth);
  uint64_t id = mixKey(h) & ((1ULL << 52) - 1);  // JSON-safe, and below the torch vendor world (1 << 52)
  if (id == 0) id = 1;
  std::string name = strFormat("mpi:%s(c%llu#%llu)", kind, (unsigned long long)parentId, (unsigned long long)nth);
  std::lock_guard<std::mutex> g2(gMu);
  CommEntry* e = newEntry(id, std::move(globals), rank, name);
  if (!putComm(handleKey(child), e))
    HETOBS_WARN("more than %zu MPI communicators: %s is not watched", kCommSlots, name.c_str());
}

CommEntry* entryOf(MPI_Comm c) { return c == MPI_COMM_WORLD ? gWorld : findComm(handleKey(c)); }

// Comm_idup's children between the call and the completion of its request.
struct ParkedIdup {
  std::atomic<bool> used{false};
  uint64_t parentId = 0;
  uint64_t nth = 0;
  MPI_Comm* out = nullptr;
};
constexpr size_t kParkedIdups = 64;
ParkedIdup gIdups[kParkedIdups];
// The "communicator" of a parked idup's request entry: never dereferenced, only compared.
char gIdupTag;

}  // namespace

ExternalComm* const kIdupRequest = reinterpret_cast<ExternalComm*>(&gIdupTag);

void onCommCreated(MPI_Comm parent, MPI_Comm child, const char* kind, int64_t salt, bool collectiveOnParent) {
  if (!gActive.load(std::memory_order_acquire)) return;
  try {
    CommEntry* p = entryOf(parent);
    // Every member of the parent calls the constructor, so its count of children is the
    // same on all of them (also on ranks that get MPI_COMM_NULL: they count too).
    uint64_t nth = (p && collectiveOnParent) ? p->children.fetch_add(1) + 1 : 0;
    if (p) watchChild(p->id, child, kind, salt, nth);
  } catch (const std::exception& e) {
    HETOBS_WARN("cannot watch a new MPI communicator: %s", e.what());
  }
}

uint64_t parkIdup(MPI_Comm parent, MPI_Comm* out) {
  if (!gActive.load(std::memory_order_acquire) || !out) return 0;
  CommEntry* p = entryOf(parent);
  if (!p) return 0;
  // Its place among the parent's children is taken now, in call order, which every member
  // shares; completions may come in any order.
  uint64_t nth = p->children.fetch_add(1) + 1;
  for (size_t i = 0; i < kParkedIdups; ++i) {
    bool free = false;
    if (gIdups[i].used.compare_exchange_strong(free, true, std::memory_order_acq_rel)) {
      gIdups[i].parentId = p->id;
      gIdups[i].nth = nth;
      gIdups[i].out = out;
      return i + 1;
    }
  }
  HETOBS_WARN("more than %zu MPI_Comm_idup pending: the new communicator is not watched", kParkedIdups);
  return 0;
}

void finishIdup(uint64_t token, bool created) {
  if (token == 0 || token > kParkedIdups) return;
  ParkedIdup& slot = gIdups[token - 1];
  try {
    if (created) watchChild(slot.parentId, *slot.out, "idup", 0, slot.nth);
  } catch (const std::exception& e) {
    HETOBS_WARN("cannot watch a new MPI communicator: %s", e.what());
  }
  slot.used.store(false, std::memory_order_release);
}

void onCommFree(MPI_Comm c) {
  if (!gActive.load(std::memory_order_acquire) || c == MPI_COMM_WORLD || c == MPI_COMM_NULL) return;
  std::lock_guard<std::mutex> g(gMu);
  uint64_t key = handleKey(c);
  CommEntry* e = findComm(key);
  if (!e) return;
  putComm(key, nullptr);
  // With nothing in flight the communicator leaves the runtime's registry (dumps and the
  // rank file stop listing it; its records stay in the ring). A nonblocking op still
  // running keeps it, as MPI does, until the process ends.
  Observed::InFlight f;
  if (e->ext && !e->ext->inFlight(&f)) {
    e->x = nullptr;
    e->ext.reset();
  }
}

void setUp() {
  std::lock_guard<std::mutex> guard(gMu);
  // 1. Settings, and whether every rank can take part.
  std::string why;
  EnvSettings s;
  int ok = readEnvSettings(&s, &why) ? 1 : 0;
  if (ok) applyLogLevel(s);
  if (ok && !s.watchdog) ok = 2;  // HETOBS_WATCHDOG=0: nothing to record into; stay out of the way
  int rank = 0, size = 1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &size);
  // Every rank must take the same path through the collectives below: agree on whether
  // all can take part (min of ok) and whether any lacks a job id (max, as min of -x).
  int mine[2] = {ok == 1 ? 1 : 0, s.job_id_generated ? -1 : 0}, all[2] = {0, 0};
  if (PMPI_Allreduce(mine, all, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS) all[0] = 0;
  if (!ok) stderrLine(why + " (rank " + std::to_string(rank) + "): the MPI interposer is off in this job");
  if (!all[0]) return;
  setLogPrefix("rank " + std::to_string(rank));

  // 2. One job id for every rank: rank 0's, if any rank has none of the job variables.
  if (all[1] < 0) {
    char buf[136] = {0};
    if (rank == 0) snprintf(buf, sizeof buf, "%s", s.job_id.c_str());
    PMPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    buf[sizeof buf - 1] = 0;
    s.job_id = buf;
  }

  // 3. This rank's runtime and side channel, then everyone's card.
  constexpr int kCardBytes = 1024;
  std::vector<char> mineCard(kCardBytes, 0), cards;
  bool localOk = false;
  Runtime* rt = nullptr;
  try {
    rt = &Runtime::init(runtimeConfigFrom(s, rank, size));
    Credentials cred{s.job_id, s.secret.empty() ? s.job_id : s.secret};
    // Bound where peers are told to dial it, not on every interface (HETOBS_SOCKET_IFNAME first).
    std::string ip = advertisedAddressFromEnv();
    gListener = new Listener(cred, ip);
    gListener->setControlHandler([rt](const std::string& req) { return rt->handleControl(req); });
    Card c;
    c.rank = rank;
    c.pid = int(getpid());
    c.host_key = localHostKey();
    c.hostname = localHostname();
    c.ip = ip;
    c.port = gListener->port();
    std::string enc = c.encode();
    if (enc.size() < size_t(kCardBytes)) {
      memcpy(mineCard.data(), enc.data(), enc.size());
      localOk = true;
    } else {
      HETOBS_WARN("this rank's card is %zu bytes (over %d): peers cannot reach its side channel", enc.size(),
                  kCardBytes);
    }
  } catch (const std::exception& e) {
    stderrLine(std::string("cannot start the runtime (rank ") + std::to_string(rank) + "): " + e.what() +
               "; this rank is not watched");
  }
  cards.resize(size_t(kCardBytes) * size_t(size));
  PMPI_Allgather(mineCard.data(), kCardBytes, MPI_CHAR, cards.data(), kCardBytes, MPI_CHAR, MPI_COMM_WORLD);
  if (!localOk || !rt) return;
  try {
    std::vector<Card> world(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      const char* p = cards.data() + size_t(r) * kCardBytes;
      std::string text(p, strnlen(p, kCardBytes));
      try {
        world[size_t(r)] = Card::decode(text);
      } catch (const std::exception&) {
        world[size_t(r)].rank = r;  // that rank is not watched: no address
        world[size_t(r)].ip = "";
        world[size_t(r)].port = 0;
      }
    }
    rt->setWorld(world);
    std::vector<int> globals(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) globals[size_t(r)] = r;
    gWorld = newEntry(0, std::move(globals), rank, "mpi:MPI_COMM_WORLD");
    gActive.store(true, std::memory_order_release);
    HETOBS_INFO("MPI interposer active: job %s, %d ranks, dumps under %s", s.job_id.c_str(), size,
                rt->jobDir().path().c_str());
  } catch (const std::exception& e) {
    stderrLine(std::string("cannot watch MPI_COMM_WORLD (rank ") + std::to_string(rank) + "): " + e.what());
  }
}

void tearDown() {
  std::lock_guard<std::mutex> guard(gMu);
  if (!gActive.exchange(false)) return;
  try {
    if (Runtime* rt = Runtime::get()) rt->markExit(true);
  } catch (const std::exception& e) {
    HETOBS_WARN("cannot mark this rank's clean exit: %s", e.what());
  }
}

}  // namespace mpi
}  // namespace hetobs
