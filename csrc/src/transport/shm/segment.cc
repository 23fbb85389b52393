#include "hetobs/transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <new>

#include "hetobs/common/asymmetric_fence.h"
#include "hetobs/common/error.h"
#include "hetobs/transport/shm/single_copy.h"

namespace hetobs {
namespace shm {
namespace {
constexpr size_t kHeaderBytes = 256;
constexpr size_t kCtlBytes = 512;
static_assert(sizeof(SegmentHeader) <= kHeaderBytes, "segment header fits");
static_assert(sizeof(RingCtl) <= kCtlBytes, "ring control fits");
}  // namespace

size_t Segment::sizeFor(uint32_t nslots, uint64_t ringBytes) {
  return kHeaderBytes + size_t(nslots) * (kCtlBytes + ringBytes);
}

Segment::Segment(std::string name, uint8_t* base, size_t size, bool owner)
    : name_(std::move(name)), base_(base), size_(size), owner_(owner), linked_(owner) {}

Segment::~Segment() {
  if (owner_ && linked_) shm_unlink(name_.c_str());
  munmap(base_, size_);
}

void Segment::unlink() {
  if (owner_ && linked_) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

RingCtl* Segment::ring(uint32_t slot) const {
  return reinterpret_cast<RingCtl*>(base_ + kHeaderBytes + size_t(slot) * (kCtlBytes + ringBytes()));
}

uint8_t* Segment::data(uint32_t slot) const {
  return base_ + kHeaderBytes + size_t(slot) * (kCtlBytes + ringBytes()) + kCtlBytes;
}

std::unique_ptr<Segment> Segment::create(const std::string& name, uint32_t nslots, uint64_t ringBytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("shm_open(" + name + ") failed: " + errnoString(errno));
  size_t size = sizeFor(nslots, ringBytes);
  if (ftruncate(fd, off_t(size)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw Error(strFormat("cannot size shared memory %s to %zu bytes: %s (is /dev/shm full?)", name.c_str(), size,
                          errnoString(e).c_str()));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw Error("mmap of " + name + " failed: " + errnoString(e));
  }
  auto* base = static_cast<uint8_t*>(p);
  auto* h = new (base) SegmentHeader();
  h->nslots = nslots;
  h->ring_bytes = ringBytes;
  h->version = kSegmentVersion;
  h->owner_pid = int32_t(getpid());
  h->probe_addr = reinterpret_cast<uint64_t>(probeWord());
  h->probe_value = *probeWord();
  // This rank's waits on its bell take a heavy fence where it can, so producers may not fence.
  h->bell.heavy_waiter.store(asymmetricFencesAvailable() ? 1 : 0, std::memory_order_relaxed);
  for (uint32_t s = 0; s < nslots; ++s) {
    auto* ring = new (base + kHeaderBytes + size_t(s) * (kCtlBytes + ringBytes)) RingCtl();
    for (FrameHeader& m : ring->mail) m.chunk = kNoMail;  // frame 0 is not there yet
  }
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kSegmentMagic;
  return std::unique_ptr<Segment>(new Segment(name, base, size, true));
}

std::unique_ptr<Segment> Segment::open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("cannot open peer shared memory " + name + ": " + errnoString(errno));
  struct stat st {};
  fstat(fd, &st);
  size_t size = size_t(st.st_size);
  if (size < kHeaderBytes) {
    close(fd);
    throw Error("peer shared memory " + name + " is truncated");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) throw Error("mmap of " + name + " failed: " + errnoString(e));
  auto* h = static_cast<SegmentHeader*>(p);
  if (h->magic != kSegmentMagic || h->version != kSegmentVersion ||
      size != sizeFor(h->nslots, h->ring_bytes)) {
    munmap(p, size);
    throw Error(strFormat("peer shared memory %s has an unknown layout (magic 0x%08x version %u)", name.c_str(),
                          h->magic, h->version));
  }
  return std::unique_ptr<Segment>(new Segment(name, static_cast<uint8_t*>(p), size, false));
}

}  // namespace shm
}  // namespace hetobs
