#include "hetobs/collectives/digest.h"

#include <algorithm>
#include <cstring>

#include "hetobs/collectives/algorithm.h"

namespace hetobs {
namespace {

// xxHash64's primes and round: acc = rotl(acc + w * P2, 31) * P1 is a bijection of acc for a
// fixed word w (add, rotate, multiply by an odd number), and of w for a fixed acc.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull;
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t round1(uint64_t acc, uint64_t w) { return rotl(acc + w * kP2, 31) * kP1; }
inline uint64_t load64(const uint8_t* p) {
  uint64_t w;
  memcpy(&w, p, 8);
  return w;
}

// Pieces per round when a mismatch is located: 64 digests (512 bytes) per rank per round, so
// 16 Mi elements take four rounds and a last one of values.
constexpr size_t kPieces = 64;

// Every rank's `bytes` at `all + rank * bytes`, around the ring: n-1 steps, each forwarding the
// block received in the step before, on the op's own links (its ring neighbours are connected
// whatever algorithm it ran) and with its frame description (desc_), which every rank shares.
void ringGather(Communicator& c, const uint8_t* mine, size_t bytes, uint8_t* all) {
  const int n = c.size(), r = c.rank();
  if (all + size_t(r) * bytes != mine) memcpy(all + size_t(r) * bytes, mine, bytes);
  for (int k = 0; k < n - 1; ++k) {
    SendItem s{};
    s.peer = mod(r + 1, n);
    s.data = all + size_t(mod(r - k, n)) * bytes;
    s.len = bytes;
    RecvItem v{};
    v.peer = mod(r - 1, n);
    v.dst = all + size_t(mod(r - k - 1, n)) * bytes;
    v.len = bytes;
    c.exchange(&s, 1, &v, 1);
  }
}

// Whether column `i` of n rows of `width` words holds one value.
bool columnEqual(const std::vector<uint64_t>& all, int n, size_t width, size_t i) {
  for (int r = 1; r < n; ++r)
    if (all[size_t(r) * width + i] != all[i]) return false;
  return true;
}

// A value held by more ranks than any other value (*found false on a tie).
uint64_t plurality(std::vector<uint64_t> v, bool* found) {
  std::sort(v.begin(), v.end());
  uint64_t best = v[0];
  size_t bestRun = 0, secondRun = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j < v.size() && v[j] == v[i]) ++j;
    size_t run = j - i;
    if (run > bestRun) {
      secondRun = bestRun;
      bestRun = run;
      best = v[i];
    } else if (run > secondRun) {
      secondRun = run;
    }
    i = j;
  }
  *found = bestRun > secondRun;
  return best;
}

// The first element of `count` (of `es` bytes each) at `p` where any rank's copy differs:
// narrowed by 64 piece digests a round, then the last piece's values compared. Collective.
int64_t locate(int n, const GatherFn& gather, const uint8_t* p, size_t count, size_t es) {
  std::vector<uint64_t> mine(kPieces), all(size_t(n) * kPieces);
  size_t lo = 0, hi = count;
  while (hi - lo > kPieces) {
    for (size_t i = 0; i < kPieces; ++i) {
      Block b = blockOf(hi - lo, int(kPieces), int(i));
      mine[i] = digestBytes(p + (lo + b.offset) * es, b.count * es);
    }
    gather(reinterpret_cast<const uint8_t*>(mine.data()), kPieces * 8, reinterpret_cast<uint8_t*>(all.data()));
    size_t found = kPieces;
    for (size_t i = 0; i < kPieces && found == kPieces; ++i)
      if (!columnEqual(all, n, kPieces, i)) found = i;
    if (found == kPieces) return -1;  // the digests of the whole differed, no piece's does: not reproducible
    Block b = blockOf(hi - lo, int(kPieces), int(found));
    lo += b.offset;
    hi = lo + b.count;
  }
  for (size_t i = 0; i < kPieces; ++i) {
    mine[i] = 0;
    if (lo + i < hi) memcpy(&mine[i], p + (lo + i) * es, es);  // es <= 8: every dtype fits a word
  }
  gather(reinterpret_cast<const uint8_t*>(mine.data()), kPieces * 8, reinterpret_cast<uint8_t*>(all.data()));
  for (size_t i = 0; lo + i < hi; ++i)
    if (!columnEqual(all, n, kPieces, i)) return int64_t(lo + i);
  return -1;
}

}  // namespace

uint64_t digestBytes(const uint8_t* p, size_t n) {
  uint64_t h0 = kP1 + kP2, h1 = kP2, h2 = 0, h3 = 0 - kP1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    h0 = round1(h0, load64(p + i));
    h1 = round1(h1, load64(p + i + 8));
    h2 = round1(h2, load64(p + i + 16));
    h3 = round1(h3, load64(p + i + 24));
  }
  for (; i + 8 <= n; i += 8) h0 = round1(h0, load64(p + i));
  if (i < n) {
    uint64_t w = 0;
    memcpy(&w, p + i, n - i);
    h1 = round1(h1, w);
  }
  // One lane's change changes the sum (the others fixed), and the finish is a bijection.
  uint64_t h = rotl(h0, 1) + rotl(h1, 7) + rotl(h2, 12) + rotl(h3, 18) + uint64_t(n);
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

bool resultOf(const OpArgs& a, uint8_t** data, size_t* count) {
  switch (a.op) {
    case OpKind::kAllReduce:
    case OpKind::kBroadcast:
      *data = a.recv;
      *count = a.send_count;
      return true;
    case OpKind::kAllGather:
      *data = a.recv;
      *count = a.recv_count;
      return true;
    default:
      return false;
  }
}

void flipBit(uint8_t* data, size_t count, size_t es, uint64_t element, uint32_t bit) {
  if (element >= count || es == 0) return;
  bit %= uint32_t(es * 8);
  data[element * es + bit / 8] ^= uint8_t(1u << (bit % 8));
}

void flipResultBit(const OpArgs& a, uint64_t element, uint32_t bit) {
  uint8_t* data = nullptr;
  size_t count = 0;
  if (resultOf(a, &data, &count)) flipBit(data, count, dtypeSize(a.dtype), element, bit);
}

bool compareResults(int n, const uint8_t* data, size_t count, size_t es, const GatherFn& gather, uint8_t* all,
                    DigestVerdict* out) {
  if (n < 2) return false;
  const uint64_t mine = digestBytes(data, count * es);
  gather(reinterpret_cast<const uint8_t*>(&mine), 8, all);
  const uint64_t* d = reinterpret_cast<const uint64_t*>(all);
  bool same = true;
  for (int r = 1; r < n && same; ++r) same = d[r] == d[0];
  if (same) return false;
  // A difference: the failure path from here (allocation is fine).
  std::vector<uint64_t> digests(d, d + n);
  bool found = false;
  const uint64_t ref = plurality(digests, &found);
  out->majority = found;
  out->differing.clear();
  for (int r = 0; r < n; ++r)
    if (!found || digests[size_t(r)] != ref) out->differing.push_back(r);
  out->element = locate(n, gather, data, count, es);
  return true;
}

bool compareResults(Communicator& c, const OpArgs& a, DigestVerdict* out) {
  uint8_t* data = nullptr;
  size_t count = 0;
  if (c.size() < 2 || !resultOf(a, &data, &count)) return false;
  // The op is done with its scratch: n words of it, allocated once.
  uint8_t* all = c.scratch(size_t(c.size()) * 8);
  // A lambda of one pointer fits std::function's inline buffer: no allocation per check.
  auto ring = [&c](const uint8_t* mine, size_t bytes, uint8_t* to) { ringGather(c, mine, bytes, to); };
  return compareResults(c.size(), data, count, dtypeSize(a.dtype), ring, all, out);
}

}  // namespace hetobs
