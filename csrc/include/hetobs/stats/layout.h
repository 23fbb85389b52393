#pragma once
// The live stats segment: one shared-memory file per rank in node-local memory
// (/dev/shm/hetobs-stats-<job>-r<rank>), mode 0600. Another process (an exporter,
// `hetobs top`, a diagnosis of a hung job) maps it read-only and reads it while the
// rank runs, hangs or is stopped. hetobs/stats.py reads the same layout.
//
// Layout version 5 (all little-endian, offsets in the header). Version 2 added the
// header's island fields and, per OpRecord, `island` and `phases`; version 3 a CommStats
// slot per OpKind including kRelay (host relays of island ops were counted nowhere), so
// comm_bytes grew and nothing else moved; version 4 appends `device` and `library` to each
// OpRecord (record_bytes grew) and the island's device and library to the header; version 5
// appends the header's `boot_id` (nothing else moved). hetobs/stats.py reads 2, 3, 4 (those
// without a boot id: their liveness judged by pid and start ticks alone) and 5, and refuses
// any other version (the record ring's stride and fields change).
//   [StatsHeader, 4096 B]
//   [CommStats x comm_capacity]     one per communicator, fixed capacity
//   [LinkStats x link_capacity]     one per (communicator, peer)
//   [OpRecord  x record_capacity]   the recorder's ring (record/op_record.h)
//
// Consistency without locking the writer: every CommStats and OpRecord carries a
// seqlock `version` (odd while written; read, copy, re-read, retry on change).
// Counters in LinkStats are single 64-bit atomics, read individually.
// A reader must check magic, version and sizes, that boot_id is this boot's, and that
// pid + process_start_ticks still name a live process (else the segment is stale: the
// rank died, or the machine rebooted and the pid now means another process).
#include <atomic>
#include <cstdint>

#include "hetobs/common/wire.h"
#include "hetobs/record/link_health.h"
#include "hetobs/record/op_record.h"
#include "hetobs/record/progress.h"

namespace hetobs {
namespace stats {

constexpr char kMagic[8] = {'H', 'T', 'B', 'S', 'T', 'A', 'T', 'S'};
constexpr uint32_t kVersion = 5;
constexpr uint32_t kBootIdBytes = 40;  // a boot id is 36 characters (a UUID)
constexpr uint32_t kHeaderBytes = 4096;
constexpr uint32_t kOpKinds = uint32_t(OpKind::kCount);  // every kind, relay included
constexpr uint32_t kLatencyBuckets = 24;  // bucket b counts ops with duration < 2^b microseconds (last: the rest)
constexpr uint32_t kBandwidthBuckets = 20;  // bucket b counts ops with busbw < 2^b MB/s (last: the rest)
constexpr uint32_t kLagBuckets = 28;  // arrival lag: bucket b counts lags < 2^b microseconds (last: the rest)

enum class RankState : uint32_t { kRunning = 0, kExitedCleanly = 1 };

struct StatsHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint32_t comm_capacity, comm_bytes;
  uint32_t link_capacity, link_bytes;
  uint32_t record_capacity, record_bytes;
  uint64_t comms_offset, links_offset, records_offset, total_bytes;
  int32_t pid, rank, world_size, reserved0;
  uint64_t process_start_ticks;  // /proc/self/stat field 22: tells a reused pid apart
  char job[64];
  char host[64];
  double hang_timeout_s;
  std::atomic<int64_t> heartbeat_ns;      // wall clock, bumped by the watchdog each tick
  std::atomic<int64_t> last_progress_ns;  // wall clock of the last finished op or progress step
  std::atomic<uint64_t> hangs_detected;
  std::atomic<uint64_t> dumps_written;
  std::atomic<uint64_t> records_next;     // next record id (ring end); slot = id % capacity
  std::atomic<uint32_t> state;            // RankState
  std::atomic<uint32_t> comms_used;
  std::atomic<uint32_t> links_used;
  uint32_t reserved1;
  int64_t wall_minus_mono_ns;  // record times are monotonic: add this for wall-clock ns
  // Islands (heterogeneous jobs): the rank's island, written once by its first island
  // communicator before its first op ("" when the rank runs no hierarchical op), and the
  // busy time of each phase summed over the rank's hierarchical ops (atomic adds at op end).
  char island[kIslandNameBytes];
  std::atomic<uint64_t> island_vendor_ns, island_d2h_ns, island_wire_ns, island_h2d_ns;
  std::atomic<uint64_t> island_chunks;
  std::atomic<uint64_t> island_ops;
  // Appended in version 4, written with `island`: the island's device type and library by name.
  char island_device[kDeviceNameBytes];
  char island_library[kLibraryNameBytes];
  // Appended in version 5: /proc/sys/kernel/random/boot_id of the boot `pid` lives in.
  char boot_id[kBootIdBytes];
  // Appended without a version bump (a segment of an older build reads 0 here, which is true:
  // it had no early stage): the suspected hangs this rank's watchdog dumped, and how many of
  // them it then saw complete, slow but not hung (observe/stall_history.h).
  std::atomic<uint64_t> hangs_suspected;
  std::atomic<uint64_t> hangs_resolved;
};
static_assert(sizeof(StatsHeader) <= kHeaderBytes, "stats header fits its page");

struct OpKindStats {
  uint64_t calls, bytes, errors, total_ns;
  uint64_t latency[kLatencyBuckets];
  uint64_t busbw[kBandwidthBuckets];  // ops that moved bytes and completed
};

struct CommStats {
  uint64_t version;  // seqlock (__atomic builtins)
  uint64_t comm_id;
  int32_t size, rank;
  uint64_t coll_seq, p2p_seq;     // last issued
  uint64_t inflight_record;       // record id + 1 of the running op, 0 when idle
  int64_t inflight_start_ns;      // wall clock
  uint32_t inflight_op;           // OpKind
  uint32_t failed;
  OpKindStats ops[kOpKinds];
  // Appended without a version bump (readers step through comms by comm_bytes and read these
  // when comm_bytes has room): who arrived last at this communicator's collectives
  // (record/arrival.h). Judged: every rank's entry reached this rank. Each op is counted as a
  // last arrival on exactly one rank (the one that entered last), so summing last_arrivals
  // over ranks gives the judged ops, and a rank's share of them says how often it held the
  // others up; the histogram is of how far it came behind the first rank when it did.
  // What every judged op writes comes first (one cache line); the last rank's own counts after it.
  uint64_t arrivals_judged;
  int32_t last_arrival_rank;          // world rank last at the newest judged op (once arrivals_judged > 0)
  uint32_t arrival_pad;
  int64_t last_arrival_lag_ns;        // and how far behind the first it came
  uint64_t last_arrivals;
  uint64_t arrival_lag_total_ns;
  uint64_t arrival_lag[kLagBuckets];  // bucket b: lag < 2^b microseconds (the last: the rest)
  // Appended likewise: result digests (HETOBS_DIGEST, collectives/digest.h). Checked: sampled
  // collectives whose digests the ranks compared; mismatches: of those, the ones where this
  // rank's result differed from the majority's (so the rank label names the corrupt copy).
  uint64_t digests_checked;
  uint64_t data_mismatches;
};

struct LinkStats {
  uint64_t comm_id;
  int32_t peer, global_peer;
  char transport[8];
  LinkCounters counters;
  PeerProgress progress;
  // Appended (readers of the same version index by link_bytes): times the TCP connection
  // broke and was re-made (transport/tcp/reconnect.h).
  std::atomic<uint64_t> reconnects{0};
  // Appended without a version bump: readers step through links by link_bytes, so a
  // reader of the shorter layout skips it and a newer one reads it when link_bytes has room.
  LinkHealth health;
};

}  // namespace stats
}  // namespace hetobs
