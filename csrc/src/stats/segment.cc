#include "hetobs/stats/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "hetobs/bootstrap/card.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"

namespace hetobs {
namespace stats {
namespace {

size_t align64(size_t v) { return (v + 63) & ~size_t(63); }

std::string sanitize(const std::string& s) {
  std::string o;
  for (char c : s) o += (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return o.substr(0, 100);
}

}  // namespace

uint64_t processStartTicks(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  // Fields after "(comm)": state is field 3; starttime is field 22.
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return std::stoull(field);
  return 0;
}

std::string Segment::pathFor(const std::string& job, int rank) {
  return "/hetobs-stats-" + sanitize(job) + "-r" + std::to_string(rank);
}

Segment::Segment(std::string path, uint8_t* base, size_t size, bool shared)
    : path_(std::move(path)), base_(base), size_(size), shared_(shared) {}

Segment::~Segment() {
  // Left mapped on purpose when shared: ops retiring on other threads during exit
  // may still touch it. The file itself is removed by markExited().
  if (!shared_) free(base_);
}

std::unique_ptr<Segment> Segment::create(const SegmentConfig& cfg) {
  size_t commsOff = kHeaderBytes;
  size_t linksOff = align64(commsOff + size_t(cfg.comm_capacity) * sizeof(CommStats));
  size_t recordsOff = align64(linksOff + size_t(cfg.link_capacity) * sizeof(LinkStats));
  size_t total = align64(recordsOff + size_t(cfg.record_capacity) * sizeof(OpRecord));
  std::string name = pathFor(cfg.job, cfg.rank);
  uint8_t* base = nullptr;
  bool shared = false;
  // Never truncate a segment a live process still owns (a second job with this job id and
  // rank, or a second hetobs runtime in this process): keep ours private instead. One of
  // another user's (planted in the world-writable /dev/shm) is neither used nor touched. A
  // dead predecessor's (same job id and rank) is removed: this rank replaces it.
  if (int old = shm_open(name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0); old >= 0) {
    StatsHeader h{};
    struct stat st {};
    bool ours = fstat(old, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
    ssize_t got = ours ? pread(old, &h, sizeof h, 0) : 0;
    close(old);
    // Another boot's pid names some other process now (a segment before version 5 has no boot id).
    bool thisBoot = h.version < 5 || strncmp(h.boot_id, localBootId().c_str(), sizeof h.boot_id) == 0;
    bool live = got == ssize_t(sizeof h) && memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.pid > 0 &&
                thisBoot && processStartTicks(h.pid) == h.process_start_ticks && h.state.load() == 0;
    if (!ours) {
      HETOBS_WARN("stats segment /dev/shm%s belongs to uid %u, not to this user: this rank's live stats stay "
                  "private (hetobs writes nothing there)", name.c_str(), unsigned(st.st_uid));
      name.clear();
    } else if (live) {
      HETOBS_WARN("stats segment /dev/shm%s belongs to live pid %d: this rank's live stats stay private",
                  name.c_str(), h.pid);
      name.clear();
    } else {
      HETOBS_DEBUG("removing the stale stats segment /dev/shm%s of pid %d (gone)", name.c_str(), h.pid);
      shm_unlink(name.c_str());
    }
  }
  // Exclusive: whatever appears under this name between the check and here is not ours.
  int fd = name.empty() ? -1 : shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0 && ftruncate(fd, off_t(total)) == 0) {
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      base = static_cast<uint8_t*>(p);
      shared = true;
    }
  }
  int err = errno;
  if (fd >= 0) close(fd);
  if (!shared) {
    if (!name.empty()) {
      HETOBS_WARN("cannot create the stats segment /dev/shm%s (%s): live stats are private to this process",
                  name.c_str(), errnoString(err).c_str());
      if (fd >= 0) shm_unlink(name.c_str());  // ours: made exclusively above
    }
    base = static_cast<uint8_t*>(aligned_alloc(64, total));
    if (!base) throw Error("out of memory for the stats segment");
    memset(base, 0, total);
    name.clear();
  }
  auto* h = new (base) StatsHeader();
  h->version = kVersion;
  h->header_bytes = kHeaderBytes;
  h->comm_capacity = cfg.comm_capacity;
  h->comm_bytes = sizeof(CommStats);
  h->link_capacity = cfg.link_capacity;
  h->link_bytes = sizeof(LinkStats);
  h->record_capacity = cfg.record_capacity;
  h->record_bytes = sizeof(OpRecord);
  h->comms_offset = commsOff;
  h->links_offset = linksOff;
  h->records_offset = recordsOff;
  h->total_bytes = total;
  h->pid = int32_t(getpid());
  h->rank = cfg.rank;
  h->world_size = cfg.world_size;
  h->process_start_ticks = processStartTicks(getpid());
  strncpy(h->job, cfg.job.c_str(), sizeof h->job - 1);
  strncpy(h->host, cfg.host.c_str(), sizeof h->host - 1);
  strncpy(h->boot_id, localBootId().c_str(), sizeof h->boot_id - 1);
  h->hang_timeout_s = cfg.hang_timeout_s;
  h->wall_minus_mono_ns = monoToWallNs(0);
  h->heartbeat_ns.store(wallNs());
  h->last_progress_ns.store(wallNs());
  for (uint32_t i = 0; i < cfg.comm_capacity; ++i) new (base + commsOff + i * sizeof(CommStats)) CommStats();
  for (uint32_t i = 0; i < cfg.link_capacity; ++i) new (base + linksOff + i * sizeof(LinkStats)) LinkStats();
  std::atomic_thread_fence(std::memory_order_release);
  memcpy(h->magic, kMagic, sizeof kMagic);  // last: a reader never sees a half-made header as valid
  return std::unique_ptr<Segment>(new Segment(shared ? "/dev/shm" + name : "", base, total, shared));
}

OpRecord* Segment::records() const { return reinterpret_cast<OpRecord*>(base_ + header()->records_offset); }

CommStats* Segment::allocComm() {
  uint32_t i = header()->comms_used.fetch_add(1);
  if (i >= header()->comm_capacity) return nullptr;
  return reinterpret_cast<CommStats*>(base_ + header()->comms_offset + i * sizeof(CommStats));
}

LinkStats* Segment::allocLink() {
  uint32_t i = header()->links_used.fetch_add(1);
  if (i >= header()->link_capacity) return nullptr;
  return reinterpret_cast<LinkStats*>(base_ + header()->links_offset + i * sizeof(LinkStats));
}

void Segment::markExited() {
  header()->state.store(uint32_t(RankState::kExitedCleanly));
  if (shared_ && !path_.empty()) {
    shm_unlink(path_.substr(8).c_str());
    path_.clear();
  }
}

}  // namespace stats
}  // namespace hetobs
