// Collectives through the peers' memory ("cma", cross-memory attach), every rank on this host over
// shared memory: each rank moves its own share with the kernel's process_vm_readv/writev, straight
// between the ranks' buffers, instead of forwarding blocks around the ring.
//  - all_reduce: rank q reduces block q of the buffer. Piece by piece it reads block q of every
//    peer's buffer into a cache-sized scratch and folds it into its own, then writes the finished
//    piece into every peer's buffer while the piece is still in this core's cache. The ring does
//    the same reductions in 2(n-1) dependent steps, reads each finished block back out of memory
//    (all-gather) and writes every partial sum.
//  - reduce_scatter (the first half of that): rank q folds block q of every peer's input into its
//    output.
//  - all_gather (the second half): rank q writes its block into slot q of every peer's output.
// The only waits are two rounds of small messages around the copies:
//  - "hello" going in: the address of the buffer the peers will read or write, and whether this
//    rank may read and write every peer. Nobody touches a peer's buffer before the peer is inside
//    the op, and all ranks see every rank's answer, so all take the same path: when any link
//    refuses, every rank runs the ring (this op, and every later one:
//    Communicator::peerMemoryRefused()).
//  - "done" coming out: nobody leaves while a peer may still read or write its buffer.
// Only rank q reads or writes block (slot) q of any peer's buffer, so the copies never race, and
// each all_reduce block is reduced by one rank and copied, so every rank holds the same bits.
#include <algorithm>
#include <cstring>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/collectives/peer_items.h"
#include "hetobs/collectives/reduce_kernels.h"

namespace hetobs {
namespace {

// Fits a mail slot (16 B: one cache line crosses per message).
struct Hello {
  uint64_t addr_ok;  // the buffer's address, kMayAccess set when this rank may read and write every peer
  uint64_t bytes;    // the buffer's size (the frame's op already says so: a guard before any write)
};
static_assert(sizeof(Hello) == 16);
constexpr uint64_t kMayAccess = 1ull << 63;
// Folded from scratch while in L2 (as the single copy's reduce buffer, transport/shm/channel.cc).
constexpr size_t kPiece = 256 * 1024;

// Every rank's hello, received into scratch slots (rank p's at p), and the peers' addresses.
class Hellos {
 public:
  // The scratch this op needs besides the hellos: `extra` bytes at extra().
  Hellos(Communicator& c, size_t extra)
      : c_(c), bytes_((size_t(c.size()) * sizeof(Hello) + 63) & ~size_t(63)), slots_(c.scratch(bytes_ + extra)) {}

  uint8_t* extra() const { return slots_ + bytes_; }

  // The hello round for `buffer` (`size` bytes): false, noted on the communicator, when any rank
  // may not read and write every peer (every rank sees the same answers and falls back alike).
  bool exchange(const void* buffer, size_t size) {
    const int n = c_.size(), r = c_.rank();
    bool mayAccess = true;
    for (int p = 0; p < n; ++p)
      if (p != r) mayAccess = mayAccess && c_.channel(p)->peerMemoryAccess();
    const Hello mine{reinterpret_cast<uint64_t>(buffer) | (mayAccess ? kMayAccess : 0), size};
    exchangeWithEveryPeer(c_, reinterpret_cast<const uint8_t*>(&mine), sizeof mine, slots_);
    bool all = mayAccess;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      const Hello h = of(p);
      if (h.bytes != size)
        throw PeerError(strFormat("protocol error: %s says its buffer for %s is %llu bytes, this rank's is %zu",
                                  c_.describePeer(p).c_str(), c_.desc().str().c_str(), (unsigned long long)h.bytes,
                                  size),
                        p, false);
      all = all && (h.addr_ok & kMayAccess);
    }
    if (!all) c_.notePeerMemoryRefused();
    return all;
  }

  uint64_t address(int p) const { return of(p).addr_ok & ~kMayAccess; }

  // The done round: after it no peer touches this rank's buffer.
  void done() {
    const uint64_t word = 1;
    exchangeWithEveryPeer(c_, reinterpret_cast<const uint8_t*>(&word), sizeof word, slots_);
  }

 private:
  Hello of(int p) const {
    Hello h;
    memcpy(&h, slots_ + size_t(p) * sizeof(Hello), sizeof h);
    return h;
  }

  Communicator& c_;
  size_t bytes_;
  uint8_t* slots_;
};

// Peers in the order after this rank's, so two ranks seldom copy from or to the same peer at once.
int peerAt(int r, int k, int n) { return (r + k) % n; }

// Folds bytes [off, off + m) of every peer's announced buffer into `dst`, each read into `scratch`
// (m <= kPiece) first: the read half of all_reduce, all of reduce_scatter.
void foldFromPeers(Communicator& c, const Hellos& hellos, const OpArgs& a, size_t off, uint8_t* dst,
                   uint8_t* scratch, size_t m) {
  const int n = c.size(), r = c.rank();
  for (int k = 1; k < n; ++k) {
    const int p = peerAt(r, k, n);
    c.channel(p)->readPeerMemory(hellos.address(p) + off, scratch, m);
    reduceInto(a.dtype, a.redop, dst, dst, scratch, m / dtypeSize(a.dtype));
  }
}

// Writes `m` bytes from `src` to [off, off + m) of every peer's announced buffer, while they are in
// this core's cache: the write half of all_reduce, all of all_gather.
void writeToPeers(Communicator& c, const Hellos& hellos, size_t off, const uint8_t* src, size_t m) {
  const int n = c.size(), r = c.rank();
  for (int k = 1; k < n; ++k) {
    const int p = peerAt(r, k, n);
    c.channel(p)->writePeerMemory(hellos.address(p) + off, src, m);
  }
}

}  // namespace

bool allReduceCma(Communicator& c, const OpArgs& a) {
  const size_t es = dtypeSize(a.dtype);
  Hellos hellos(c, kPiece);
  if (!hellos.exchange(a.recv, a.send_count * es)) return false;
  const Block mine = blockOf(a.send_count, c.size(), c.rank());
  const size_t lo = mine.offset * es, len = mine.count * es;
  for (size_t at = 0; at < len; at += kPiece) {
    const size_t m = std::min(kPiece, len - at);
    uint8_t* own = a.recv + lo + at;
    foldFromPeers(c, hellos, a, lo + at, own, hellos.extra(), m);
    if (a.redop == RedOp::kAvg) divideBy(a.dtype, own, m / es, double(c.size()));
    writeToPeers(c, hellos, lo + at, own, m);
    c.checkDeadline();  // an abort request or the op's deadline between pieces
  }
  hellos.done();
  return true;
}

bool reduceScatterCma(Communicator& c, const OpArgs& a) {
  const size_t es = dtypeSize(a.dtype);
  Hellos hellos(c, kPiece);
  if (!hellos.exchange(a.send, a.send_count * es)) return false;
  const Block mine = blockOf(a.send_count, c.size(), c.rank());
  const size_t lo = mine.offset * es, len = mine.count * es;
  // Our own contribution first; an output that is our block of the input is in place already.
  if (len && a.recv != a.send + lo) memmove(a.recv, a.send + lo, len);
  for (size_t at = 0; at < len; at += kPiece) {
    foldFromPeers(c, hellos, a, lo + at, a.recv + at, hellos.extra(), std::min(kPiece, len - at));
    c.checkDeadline();
  }
  hellos.done();
  return true;  // avg: reduceScatter() divides, as after the ring
}

bool allGatherCma(Communicator& c, const OpArgs& a) {
  const size_t bytes = a.send_count * dtypeSize(a.dtype);  // one block
  Hellos hellos(c, 0);
  if (!hellos.exchange(a.recv, bytes * size_t(c.size()))) return false;
  const size_t slot = size_t(c.rank()) * bytes;
  for (size_t at = 0; at < bytes; at += kPiece) {
    writeToPeers(c, hellos, slot + at, a.send + at, std::min(kPiece, bytes - at));
    c.checkDeadline();
  }
  hellos.done();
  return true;  // our own slot: allGather() copies it, as after the ring
}

}  // namespace hetobs
