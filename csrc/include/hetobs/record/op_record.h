#pragma once
// One op as the recorder keeps it: plain data of fixed size, so a ring of them can
// live in shared memory and be read by another process (the watchdog issue maps it).
// Field meanings follow PyTorch's Flight Recorder where they overlap.
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace hetobs {

enum class OpState : uint8_t { kEnqueued = 0, kStarted = 1, kCompleted = 2, kFailed = 3 };
enum class Algorithm : uint8_t { kNone = 0, kRing = 1, kDirect = 2, kChain = 3, kP2P = 4, kCma = 5 };
// Values are part of the dump format (names) and of the stats segment (codes): append only.
// kIslands: a hierarchical op of the "hetobs_islands" torch backend (vendor collective inside
// the island, host relay across islands), recorded once per rank.
// kVendor: another library's collectives (an island's HCCL, XCCL, ... through its torch
// plugin); the communicator's name says which ("hccl:island:b").
enum class Backend : uint8_t { kNative = 0, kGloo = 1, kNccl = 2, kMpi = 3, kIslands = 4, kVendor = 5 };
// kOther: a device outside torch's tree or any other accelerator (npu, xpu, a stand-in):
// the record's `device` names it.
enum class DeviceType : uint8_t { kCpu = 0, kCuda = 1, kOther = 2 };
// Which part of a hierarchical op is running now (an in-flight op's "phase" in dumps).
enum class IslandPhase : uint8_t { kNone = 0, kVendor = 1, kRelay = 2, kD2H = 3, kWire = 4, kH2D = 5 };
constexpr int kIslandPhases = 6;

const char* opStateName(OpState s);
const char* algorithmName(Algorithm a);
const char* backendName(Backend b);
const char* deviceTypeName(DeviceType d);
struct OpRecord;
// The device type a record names: its `device` field, else its code's name.
const char* recordDevice(const OpRecord& r);
const char* islandPhaseName(IslandPhase p);
// The phase called `name` ("vendor", "relay", "d2h", "wire", "h2d", "none"); false if none is.
bool islandPhaseFromName(const char* name, IslandPhase* out);

constexpr size_t kIslandNameBytes = 16;  // NUL included: island names are short (cuda, npu, a site name)
constexpr size_t kDeviceNameBytes = 16;  // a torch device type name (cpu, cuda, npu, standin), NUL included
constexpr size_t kLibraryNameBytes = 16; // a collective library's name (gloo, nccl, hccl, sccl, hetobs)

// Busy time of each phase of one hierarchical op. The relay is pipelined chunk by chunk,
// so d2h, wire and h2d overlap: each is the time that phase was busy, not a wall interval.
struct IslandPhases {
  int64_t vendor_ns;  // in the island's vendor collective (before and after the relay)
  int64_t d2h_ns;     // relay: device-to-host copies
  int64_t wire_ns;    // relay: sending and receiving between islands
  int64_t h2d_ns;     // relay: host-to-device copies
  uint32_t chunks;    // relay chunks moved
  uint32_t reserved;
};

constexpr uint32_t kArrivalKnown = 1;   // OpRecord::arrival_flags
constexpr uint32_t kArrivalJudged = 2;  // every rank's entry reached this rank: counted

struct OpRecord {
  // Seqlock: odd while a writer is inside; readers retry until they see the same even value twice.
  uint64_t version;  // accessed only with __atomic builtins (the struct must stay plain data)
  uint64_t record_id;      // monotonic per process; slot = id % capacity
  uint64_t comm_id;
  uint64_t coll_seq;       // collective sequence id in the communicator (0 for p2p)
  uint64_t p2p_seq;        // p2p sequence id in the communicator (0 for collectives)
  uint64_t count;          // elements in (send side)
  uint64_t out_count;      // elements out (recv side)
  uint64_t bytes;          // payload bytes of the op (nccl-tests "size")
  int64_t t_enqueue_ns;    // monotonic
  int64_t t_start_ns;
  int64_t t_end_ns;
  double algbw_gbps;       // bytes / time, GB/s
  double busbw_gbps;       // algbw x nccl-tests factor
  int32_t root_or_peer;    // root of rooted ops, peer of send/recv, -1 otherwise
  int32_t comm_size;
  int32_t comm_rank;
  uint8_t op;              // OpKind
  uint8_t dtype;           // DType
  uint8_t redop;           // RedOp
  uint8_t state;           // OpState
  uint8_t algorithm;       // Algorithm
  uint8_t backend;         // Backend
  uint8_t device_type;     // DeviceType
  uint8_t pad_[5];
  char error[96];          // first bytes of the error, if failed
  char island[kIslandNameBytes];  // the rank's island for a hierarchical op; "" for any other op
  IslandPhases phases;     // hierarchical ops: filled when the op ends (zero before, and for other ops)
  // Appended in stats layout 4: the device type of the op's buffers by name (torch's name,
  // "standin" or "npu" as well as "cpu"), and the collective library that ran it (for a
  // hierarchical op: the library inside the rank's island). "" where not known.
  char device[kDeviceNameBytes];
  char library[kLibraryNameBytes];
  // Appended without a stats layout bump (readers step by record_bytes and read these when it
  // has room): who arrived last at this collective (record/arrival.h), as this rank heard it.
  // Zero (a record's default) means not known: p2p, one rank, a failed op, a vendor backend.
  int32_t last_arrival_rank;   // world rank, valid with kArrivalKnown
  uint32_t arrival_flags;      // kArrivalKnown | kArrivalJudged (every rank's entry reached this rank)
  int64_t arrival_lag_ns;      // the last entry minus the first
  int64_t behind_first_ns;     // this rank's entry minus the first
};

// Copy a name into a fixed record field (cut, NUL-terminated).
template <size_t N>
void setName(char (&field)[N], const char* name) {
  size_t i = 0;
  for (; name && name[i] && i + 1 < N; ++i) field[i] = name[i];
  for (; i < N; ++i) field[i] = 0;
}

// nccl-tests bus bandwidth factor for an op over n ranks.
double busBwFactor(uint8_t op, int n);

}  // namespace hetobs
