#pragma once
// Single copy between same-host ranks (cross-memory attach, process_vm_readv): for a
// large message the sender puts only the address of its buffer in the ring and the
// receiver copies (or reduces) straight out of the sender's memory, one copy instead of
// two (into the ring, out of it). Open MPI's vader does the same for large messages.
//
// The kernel allows it for a process of the same uid that may ptrace the peer (a
// container's seccomp profile, Yama, a non-dumpable peer or a missing CAP_SYS_PTRACE can
// refuse it). So the reader first reads the peer's probe word (segment header) and only
// then tells the sender it may name its buffers; a refusal keeps the two-copy ring, with
// the reason logged once at debug.
//
// Lifetime: a sender's item is not done until the receiver has acknowledged every frame
// naming its buffer, so the buffer is read only while the sender is inside the op.
#include <cstddef>
#include <cstdint>
#include <string>


namespace hetobs {
namespace shm {

// A frame whose payload stays in the sender's memory carries a mark in the top byte of its
// FrameHeader.aux word and the address below it (user-space addresses stay below 2^56, even
// with 5-level paging); the ring carries the header only. A plain ring frame's aux is 0.
// (Before the arrival word took FrameHeader's first spare word, the mark and the address
// had one word each.)
constexpr uint64_t kMarkShift = 56;
constexpr uint64_t kAddrMask = (1ull << kMarkShift) - 1;
constexpr uint64_t kSingleCopyMark = 0xA1;
// Push: the sender writes (part of) a message into the receiver's buffer itself. A one-way
// message between two ranks (broadcast) then keeps both cores copying: the sender names the
// first half of its buffer (marking the first frame kPushOfferMark instead); the receiver
// answers in its push slot (RingCtl::push_to, beside the frames: a frame it had sent before,
// a point-to-point message, may still wait there unread) with where its buffer is, and reads
// the first half, while the sender writes the second half there with process_vm_writev and
// then sends a data frame marked kPushedMark (no payload) for it. Open MPI's broadcast
// between two ranks has the receiver copy all of it. A two-rank all_gather pushes all of
// each block (SendItem::pushAll, an offer frame naming nothing), each piece copied to the
// sender's own output on the way (SendItem::alsoCopyTo): each block is read once, not twice.
constexpr uint64_t kPushOfferMark = 0xA2;
constexpr uint64_t kPushedMark = 0xA3;
inline uint64_t markOf(uint64_t aux) { return aux >> kMarkShift; }
inline uint64_t addrOf(uint64_t aux) { return aux & kAddrMask; }
inline uint64_t markedAux(uint64_t mark, const void* addr) {
  return mark << kMarkShift | (reinterpret_cast<uint64_t>(addr) & kAddrMask);
}
// From this size a send that may push (SendItem::mayPush) does (2 ranks, broadcast: 1.6x at
// 256 KiB, 2x from 4 MiB against the receiver reading all of it; a C loop of the two calls;
// docs/algorithms.md).
constexpr uint64_t kPushMinBytes = 256 * 1024;
// Where a sender's pushed part starts in a message of `len` bytes it splits with the
// receiver (SendItem::pushAll pushes all of it); the receiver's answer names its whole buffer.
inline uint64_t pushStart(uint64_t len) { return (len / 2) & ~uint64_t(63); }
// A push is written in pieces of this size, each copied to SendItem::alsoCopyTo first.
constexpr uint64_t kPushPiece = 256 * 1024;
// Largest piece one such frame names: the receiver acknowledges (and the watchdog sees
// progress) piece by piece.
constexpr uint64_t kSingleCopyPiece = 1 << 20;

// This process's probe word (a random value, fixed for the process's life).
const uint64_t* probeWord();

// Whether this process can read the memory of process `pid`: the word at `probeAddr` there
// reads back as `probeValue` (a peer's SegmentHeader fields). On false, *why says what refused it.
bool canReadPeer(int pid, uint64_t probeAddr, uint64_t probeValue, std::string* why);

// Copy `len` bytes at `addr` in process `pid` into `dst`. Returns 0, or the errno.
int readPeer(int pid, uint64_t addr, void* dst, size_t len);
// Copy `len` bytes from `src` to `addr` in process `pid`. Returns 0, or the errno.
int writePeer(int pid, uint64_t addr, const void* src, size_t len);

}  // namespace shm
}  // namespace hetobs
