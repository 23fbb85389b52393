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

// Marks a data frame whose payload stays in the sender's memory: FrameHeader.reserved[1]
// holds it, reserved[0] the address (the ring carries the header only).
constexpr uint64_t kSingleCopyMark = 0x31595043454c4753ull;  // "SGLECPY1"
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

}  // namespace shm
}  // namespace hetobs
