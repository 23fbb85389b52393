#pragma once
// One send and one receive item per peer for a direct (one-round) algorithm: on the stack
// up to 64 peers, so a small op allocates nothing; larger worlds fall back to the heap.
// The stack slots are raw storage, each constructed as it is used: initialising all 128
// items up front (8 KiB) cost about as much as an 8 B all_reduce's own copies.
#include <cstddef>
#include <new>
#include <type_traits>
#include <vector>

#include "hetobs/comm/communicator.h"
#include "hetobs/transport/channel.h"

namespace hetobs {

class PeerItems {
 public:
  explicit PeerItems(int n) {
    if (n - 1 > kStack) {
      sendV_.resize(size_t(n - 1));
      recvV_.resize(size_t(n - 1));
      sp_ = sendV_.data();
      rp_ = recvV_.data();
    }
  }
  PeerItems(const PeerItems&) = delete;
  PeerItems& operator=(const PeerItems&) = delete;

  // Item k, made afresh with its defaults.
  SendItem& send(size_t k) { return *new (&sp_[k]) SendItem{}; }
  RecvItem& recv(size_t k) { return *new (&rp_[k]) RecvItem{}; }
  SendItem* sends() { return sp_; }
  RecvItem* recvs() { return rp_; }

 private:
  static_assert(std::is_trivially_destructible_v<SendItem> && std::is_trivially_destructible_v<RecvItem>,
                "raw slots are never destroyed");
  static constexpr int kStack = 64;
  alignas(SendItem) unsigned char sendRaw_[kStack * sizeof(SendItem)];
  alignas(RecvItem) unsigned char recvRaw_[kStack * sizeof(RecvItem)];
  std::vector<SendItem> sendV_;
  std::vector<RecvItem> recvV_;
  SendItem* sp_ = reinterpret_cast<SendItem*>(sendRaw_);
  RecvItem* rp_ = reinterpret_cast<RecvItem*>(recvRaw_);
};

// The direct exchange of all_gather and all_reduce: `mine` (bytes long) goes to every peer,
// and peer p's bytes land at slots + p * bytes (this rank's own slot is left alone).
inline void exchangeWithEveryPeer(Communicator& c, const uint8_t* mine, size_t bytes, uint8_t* slots) {
  const int n = c.size(), r = c.rank();
  PeerItems items(n);
  size_t k = 0;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    SendItem& s = items.send(k);
    s.peer = p;
    s.data = mine;
    s.len = bytes;
    RecvItem& v = items.recv(k);
    v.peer = p;
    v.dst = slots + size_t(p) * bytes;
    v.len = bytes;
    ++k;
  }
  c.exchange(items.sends(), k, items.recvs(), k);
}

}  // namespace hetobs
