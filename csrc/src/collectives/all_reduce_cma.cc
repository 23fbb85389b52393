// all_reduce through the peers' memory ("cma", cross-memory attach), every rank on this host
// over shared memory: rank q reduces block q of the buffer. Piece by piece it reads block q of
// every peer's buffer (process_vm_readv) into a cache-sized scratch and folds it into its own,
// then writes the finished piece into every peer's buffer (process_vm_writev) while the piece is
// still in this core's cache. The ring does the same reductions in 2(n-1) dependent steps, reads
// each finished block back out of memory (all-gather) and writes every partial sum; here the
// only waits are two rounds of small messages around the copies:
//  - "hello" going in: each rank's buffer address, and whether it may read and write every peer.
//    Nobody touches a peer's buffer before the peer is inside the op, and all ranks see every
//    rank's answer, so all take the same path: when any link refuses, every rank runs the ring
//    (this op, and every later one: Communicator::peerMemoryRefused()).
//  - "done" coming out: nobody leaves while a peer may still read or write its buffer.
// Only rank q touches block q anywhere, so the copies never race; each block is reduced by
// one rank and copied, so every rank holds the same bits.
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

}  // namespace

bool allReduceCma(Communicator& c, const OpArgs& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtypeSize(a.dtype), bytes = a.send_count * es;
  const size_t helloBytes = (size_t(n) * sizeof(Hello) + 63) & ~size_t(63);
  uint8_t* scratch = c.scratch(helloBytes + kPiece);
  uint8_t* piece = scratch + helloBytes;
  bool mayAccess = true;
  for (int p = 0; p < n; ++p)
    if (p != r) mayAccess = mayAccess && c.channel(p)->peerMemoryAccess();
  const Hello mine{reinterpret_cast<uint64_t>(a.recv) | (mayAccess ? kMayAccess : 0), bytes};
  exchangeWithEveryPeer(c, reinterpret_cast<const uint8_t*>(&mine), sizeof mine, scratch);
  auto helloOf = [&](int p) {
    Hello h;
    memcpy(&h, scratch + size_t(p) * sizeof(Hello), sizeof h);
    return h;
  };
  bool all = mayAccess;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    const Hello h = helloOf(p);
    if (h.bytes != bytes)
      throw PeerError(strFormat("protocol error: %s says its buffer for %s is %llu bytes, this rank's is %zu",
                                c.describePeer(p).c_str(), c.desc().str().c_str(), (unsigned long long)h.bytes,
                                bytes),
                      p, false);
    all = all && (h.addr_ok & kMayAccess);
  }
  if (!all) {
    c.notePeerMemoryRefused();
    return false;
  }
  auto addrOf = [&](int p) { return helloOf(p).addr_ok & ~kMayAccess; };
  const Block mineBlock = blockOf(a.send_count, n, r);
  const size_t lo = mineBlock.offset * es, len = mineBlock.count * es;
  for (size_t at = 0; at < len; at += kPiece) {
    const size_t m = std::min(kPiece, len - at);
    uint8_t* own = a.recv + lo + at;
    // Peers in the order after this rank's, so two ranks seldom read the same peer at once.
    for (int k = 1; k < n; ++k) {
      const int p = (r + k) % n;
      c.channel(p)->readPeerMemory(addrOf(p) + lo + at, piece, m);
      reduceInto(a.dtype, a.redop, own, own, piece, m / es);
    }
    if (a.redop == RedOp::kAvg) divideBy(a.dtype, own, m / es, double(n));
    for (int k = 1; k < n; ++k) {
      const int p = (r + k) % n;
      c.channel(p)->writePeerMemory(addrOf(p) + lo + at, own, m);
    }
    c.checkDeadline();  // an abort request or the op's deadline between pieces
  }
  const uint64_t done = 1;
  exchangeWithEveryPeer(c, reinterpret_cast<const uint8_t*>(&done), sizeof done, scratch);
  return true;
}

}  // namespace hetobs
