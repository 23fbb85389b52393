#pragma once
// Process-wide state of libhetobs_nccl.so: the real NCCL entry points, the runtime
// (started on first use from the HETOBS_* environment), the communicator registry and
// the side channel. Shared by the interposer (interpose.cc, op_watch.cc) and the
// profiler plugin (profiler.cc), which see the same state when NCCL_PROFILER_PLUGIN
// names this same library.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hetobs/common/env_config.h"
#include "hetobs/observe/runtime.h"
#include "nccl_api.h"
#include "nccl_comm.h"

namespace hetobs {
class Listener;

namespace nccl {

// The next definition of an NCCL function after this library (dlsym(RTLD_NEXT), then a
// libnccl.so.2 already loaded). Cached; nullptr if there is none.
void* realSymbol(const char* name, std::atomic<void*>& cache);
#define HETOBS_REAL(fn, type)                                 \
  ([]() -> type {                                             \
    static std::atomic<void*> cache{nullptr};                 \
    return reinterpret_cast<type>(realSymbol(#fn, cache));    \
  }())

const char* ncclErrorString(ncclResult_t r);

struct Process {
  EnvSettings env;
  Runtime* rt = nullptr;
  int rank = 0, size = 1;
  bool worldFromEnv = false;
  std::unique_ptr<Listener> listener;
  // Held around everything that rewrites the rank file (attach, setWorld, markExit):
  // Runtime::writeMetadata from two threads at once collides on its temp file.
  std::mutex metaMu;
};

// Join the runtime (stats slot, watchdog, rank file), serialized with other rank-file writes.
void attachComm(NcclComm& comm);

// Start hetobs in this process (once): settings, runtime, side channel, exit hook.
// `hintRank`/`hintSize` (the first communicator's) name this process's place in the
// world when no RANK/WORLD_SIZE-style variables do. nullptr when hetobs stays out:
// invalid settings (logged once) or HETOBS_WATCHDOG=0.
Process* startProcess(int hintRank, int hintSize);
Process* process();  // nullptr until started (or when disabled)
bool processDisabled();  // a start was refused: stay out for good

// A communicator id all members derive alike (53 bits, nonzero, not the native or
// torch-wrapper world ids).
uint64_t commIdFrom(const void* bytes, size_t n, uint64_t salt = 0);
// Global (world) ranks of a communicator with `size` ranks where this process is `rank`:
// the identity when it spans the world, [world rank] for a singleton, else its own
// comm ranks (NCCL does not say which world ranks a sub-communicator holds).
std::vector<int> globalRanksFor(const Process& p, int rank, int size, bool* known);

// Communicators by NCCL handle: lock-free lookup, locked insert/erase.
std::shared_ptr<NcclComm> findComm(ncclComm_t handle);
void addComm(ncclComm_t handle, const std::shared_ptr<NcclComm>& comm);
void removeComm(ncclComm_t handle);
// A communicator created outside the calls we interpose (ncclCommInitRankScalable,
// ncclCommShrink...): registered on its first op with an id local to this rank.
std::shared_ptr<NcclComm> adoptComm(ncclComm_t handle);
// Make a comm from its parts; `attach` joins the runtime (stats slot, watchdog, metadata),
// else call attachComm() once NCCL has created the communicator.
std::shared_ptr<NcclComm> makeComm(Process& p, uint64_t id, int rank, int size, int device, bool attach = true);

// Interposer comms no profiler context has claimed yet (for the plugin's binding).
void noteUnbound(const std::shared_ptr<NcclComm>& comm);
std::vector<std::shared_ptr<NcclComm>> unboundComms();

// Per-thread hints from the interposer to the profiler plugin: the comm whose NCCL call
// is running on this thread (op or init), so a plugin context created or fed on this
// thread can bind to it exactly.
struct ThreadHint {
  NcclComm* op = nullptr;
  NcclComm* init = nullptr;
};
ThreadHint& threadHint();

// What could not be recorded (logged at exit when nonzero), and whether an op failed.
struct Drops {
  std::atomic<uint64_t> slotsFull{0}, captured{0}, profilerEvents{0};
  std::atomic<bool> opsFailed{false};  // an op ended in error: the exit is not clean
};
Drops& drops();

}  // namespace nccl
}  // namespace hetobs
