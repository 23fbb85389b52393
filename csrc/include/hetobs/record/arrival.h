#pragma once
// Who arrives last at a collective, from times every rank records anyway, exchanged in the
// data frames the op sends (FrameHeader::arrival): no extra message, no extra round trip.
//
// Each rank stamps its entry (the op's enqueue time, as wall-clock microseconds: ranks on
// one host share that clock; across hosts it is as good as their clock sync, NTP or PTP) and
// every data frame it sends carries the latest entry it knows of so far (time, comm rank)
// and how far the earliest known entry is behind it. A receiver folds the word into its own
// (later of the latest, earlier of the earliest). The fold is associative and commutative,
// so along a ring the knowledge travels one hop per step: after all_reduce, all_gather and
// reduce_scatter (n-1 dependent steps) and after the direct algorithms (every pair
// exchanges) every rank holds the same answer. A chain (broadcast, reduce) carries it one
// way only: those ops are recorded with what the rank heard, and not counted.
//
// The word (64 bits): bit 63 valid; bits 45..62 the latest entrant's comm rank (18 bits);
// bits 16..44 its entry, microseconds modulo 2^29 (~9 minutes: times are compared modulo
// that, valid while entries of one op lie within ~4.5 minutes of each other); bits 0..15
// the spread (latest minus earliest entry, us) as a 16-bit float (11-bit mantissa: 0.05%).
#include <cstdint>

namespace hetobs {
namespace arrival {

constexpr uint64_t kValid = 1ull << 63;
constexpr int kRankBits = 18;
constexpr int kTimeBits = 29;
constexpr int kMaxRanks = 1 << kRankBits;  // communicators larger than this carry no arrival word
constexpr uint64_t kTimeMask = (1ull << kTimeBits) - 1;
constexpr uint64_t kRankMask = (1ull << kRankBits) - 1;

// Spread in microseconds as a 16-bit float: values below 2048 exact, above that 11 bits of
// mantissa and a 5-bit exponent (up to ~4.4e12 us: never saturates in practice).
inline uint32_t encodeSpread(uint64_t us) {
  if (us < 2048) return uint32_t(us);
  uint32_t e = 0;
  while (us >= 4096) us >>= 1, ++e;
  if (e >= 30) return 0xffffu;
  return ((e + 1) << 11) | uint32_t(us - 2048);
}
inline uint64_t decodeSpread(uint32_t code) {
  uint32_t e = code >> 11, m = code & 0x7ffu;
  return e == 0 ? m : uint64_t(2048 + m) << (e - 1);
}

inline uint64_t make(int rank, uint64_t entryUs, uint64_t spreadUs) {
  return kValid | (uint64_t(uint32_t(rank)) & kRankMask) << 45 | (entryUs & kTimeMask) << 16 |
         encodeSpread(spreadUs);
}
inline int rankOf(uint64_t w) { return int((w >> 45) & kRankMask); }
inline uint64_t timeOf(uint64_t w) { return (w >> 16) & kTimeMask; }
inline uint64_t spreadOf(uint64_t w) { return decodeSpread(uint32_t(w & 0xffffu)); }
// a - b modulo 2^29, as a signed distance.
inline int64_t diff(uint64_t a, uint64_t b) {
  int64_t d = int64_t((a - b) & kTimeMask);
  return d >= int64_t(1ull << (kTimeBits - 1)) ? d - int64_t(1ull << kTimeBits) : d;
}

// The fold of two words (either may be 0: nothing known). Entries at the same microsecond go
// to the rank with the larger rank ^ low time bits: a tie names no rank more often than another.
inline uint64_t combine(uint64_t a, uint64_t b) {
  if (!(a & kValid)) return b;
  if (!(b & kValid)) return a;
  if (a == b) return a;
  const uint64_t ta = timeOf(a), tb = timeOf(b);
  int64_t d = diff(ta, tb);
  bool aLater = d > 0 || (d == 0 && (uint64_t(rankOf(a)) ^ (ta & kRankMask)) > (uint64_t(rankOf(b)) ^ (tb & kRankMask)));
  const uint64_t late = aLater ? a : b;
  // Earliest known entry of each side, relative to the later latest entry: later minus spread.
  int64_t ea = diff(ta, timeOf(late)) - int64_t(spreadOf(a));
  int64_t eb = diff(tb, timeOf(late)) - int64_t(spreadOf(b));
  int64_t earliest = ea < eb ? ea : eb;  // <= 0
  return make(rankOf(late), timeOf(late), uint64_t(-earliest));
}

}  // namespace arrival

// What a rank knows at the end of a collective: the latest entrant (world rank), how far it
// came behind the earliest, and how far this rank came behind the earliest.
struct ArrivalInfo {
  int32_t last_rank = -1;     // world rank; -1: not known (p2p, one rank, the op failed)
  uint32_t flags = 0;         // kArrivalKnown | kArrivalJudged (record/op_record.h)
  int64_t lag_ns = 0;         // last entry minus first entry
  int64_t behind_first_ns = 0;  // this rank's entry minus the first entry
};

}  // namespace hetobs
