#pragma once
// One shared-memory segment per (communicator, rank) on a host: the rank's doorbell,
// its abort word, and one incoming ring per local peer (single producer, single
// consumer). Peers map it during set-up; the owner unlinks the name as soon as every
// peer has mapped it, so a crash never leaves a file behind in /dev/shm.
//
// Layout (version 3): [SegmentHeader 256 B] then per slot [RingCtl 512 B][data ringBytes].
// Version 2 added the owner's probe word (SegmentHeader) and the consumer's single-copy
// flag (RingCtl): a frame may name bytes in the producer's memory instead of carrying them.
// Version 3 added the mail slots and the push slot (RingCtl): small frames in one cache line
// each beside the ring, and a receiver's buffer for a sender that writes part of a message.
// Version 4: frames carry the arrival word; a mail frame's payload is 8 bytes (was 16) and a
// single-copy frame's mark shares the aux word with the address.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hetobs/common/futex.h"
#include "hetobs/common/wire.h"

namespace hetobs {
namespace shm {

constexpr uint32_t kSegmentMagic = 0x4d485348;  // "HSHM"
constexpr uint32_t kSegmentVersion = 4;

// Mail slots: a frame whose payload fits in a header's aux word (8 bytes) skips the ring. The
// producer writes frame c whole into slot c % kMailSlots and its chunk word last (release);
// the consumer, due frame c, finds it complete when that slot's chunk word says c. One cache
// line crosses between the cores per small message, where the ring moved three one after
// the other (the head, then the header, then the payload line): an 8 B all_reduce is mostly
// those crossings. A slot is reused for frame c + kMailSlots only once the consumer has
// acknowledged frame c (consumed_frames); with every slot still held, frames take the ring.
constexpr uint32_t kMailSlots = 4;
constexpr size_t kMailPayload = sizeof(FrameHeader::aux);
constexpr uint64_t kNoMail = ~0ull;  // a slot's chunk word before its first frame

struct RingCtl {
  alignas(64) std::atomic<uint64_t> head;             // bytes published by the producer
  alignas(64) std::atomic<uint64_t> tail;             // bytes released by the consumer
  alignas(64) std::atomic<uint64_t> consumed_frames;  // frames the consumer finished (the "ack")
  // Set by the consumer once it has read the producer's probe word with process_vm_readv:
  // the producer may then send frames that name its own buffer (transport/shm/single_copy.h).
  std::atomic<uint32_t> single_copy;
  uint8_t pad_[64 - sizeof(std::atomic<uint64_t>) - sizeof(std::atomic<uint32_t>)];
  alignas(64) FrameHeader mail[kMailSlots];  // written by the producer; chunk words start at kNoMail
  // Written by the producer for the consumer: where the consumer may write the rest of the
  // message it offered to push (single_copy.h): aux the address, bytes the length,
  // the op's header, and chunk (last, release) the count of offers answered on this link.
  alignas(64) FrameHeader push_to;
};
static_assert(sizeof(RingCtl) == 192 + 64 * kMailSlots + 64, "ring control layout");

struct SegmentHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t nslots;
  uint32_t reserved;
  uint64_t ring_bytes;
  alignas(64) Doorbell bell;            // rung for any event this rank waits on
  alignas(64) std::atomic<uint32_t> abort;  // set by a peer that aborts the communicator
  // The owner's pid (as it sees itself) and a word of its private memory with a value no
  // other process holds: a peer that reads that value with process_vm_readv at that pid
  // knows it can read the owner's buffers (same pid namespace, ptrace allowed).
  int32_t owner_pid;
  uint32_t reserved2;
  uint64_t probe_addr;
  uint64_t probe_value;
};

class Segment {
 public:
  static std::unique_ptr<Segment> create(const std::string& name, uint32_t nslots, uint64_t ringBytes);
  static std::unique_ptr<Segment> open(const std::string& name);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  void unlink();  // remove the name (mappings stay valid)
  const std::string& name() const { return name_; }
  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }
  RingCtl* ring(uint32_t slot) const;
  uint8_t* data(uint32_t slot) const;
  uint64_t ringBytes() const { return header()->ring_bytes; }

 private:
  Segment(std::string name, uint8_t* base, size_t size, bool owner);
  static size_t sizeFor(uint32_t nslots, uint64_t ringBytes);
  std::string name_;
  uint8_t* base_;
  size_t size_;
  bool owner_;
  bool linked_;
};

}  // namespace shm
}  // namespace hetobs
