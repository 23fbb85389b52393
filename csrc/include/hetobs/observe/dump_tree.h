#pragma once
// Job-wide dump requests spread down a tree of side channels instead of every
// detecting rank asking all N-1 peers itself (N^2 handshakes at scale).
//
// Positions are ranks relabelled around the rank that started the spread (the origin):
// rank = (origin + pos) % n. A rank that receives the request for [lo, hi) dumps itself
// (position lo) and hands the rest, (lo, hi), cut into up to `fanout` contiguous chunks,
// to each chunk's first rank. When that rank does not answer (dead, stopped), the asker
// takes over the chunk: it hands the chunk's own rest on, cut the same way. So the
// subtree of a dead rank is still reached, every live rank is asked once per spread, and
// the depth is about log_fanout(n) plus one level per dead rank on a path.
#include <cstdint>
#include <functional>
#include <vector>

namespace hetobs {

constexpr int kSpreadFanout = 4;  // 4 threads per rank at most; depth log4(N): 10 at 1M ranks

struct SpreadInterval {
  int lo = 0, hi = 0;  // positions [lo, hi); the rank at lo is the chunk's head
};

// The chunks the head of `iv` hands on: (iv.lo, iv.hi) cut into up to `fanout` parts.
std::vector<SpreadInterval> spreadChunks(SpreadInterval iv, int fanout);
inline int spreadRank(int origin, int pos, int n) { return int((int64_t(origin) + pos) % n); }

struct SpreadOutcome {
  std::vector<int> asked, answered, unanswered;  // ranks, in the order asked
};

// Hand `mine`'s rest on: one thread per chunk; `ask(rank, chunk)` sends one request and
// says whether it was answered. An unanswered chunk is taken over (its rest asked) by the
// same thread.
SpreadOutcome spreadRequests(int origin, int n, SpreadInterval mine, int fanout,
                             const std::function<bool(int rank, SpreadInterval chunk)>& ask);

// The same chunking and take-over, round by round without a network: a request sent in
// round r reaches its rank in round r; an unanswered one is taken over by its sender in
// round r + 1 (after its timeout). For tests and the scale bench.
struct SpreadSimulation {
  int64_t messages = 0;  // requests sent, answered or not
  int rounds = 0;        // rounds until nothing is left to send
  int64_t reached = 0;   // distinct live ranks that received a request (the origin counts)
  int64_t duplicates = 0;  // requests a rank received after its first
};
SpreadSimulation simulateSpread(int n, const std::vector<uint8_t>& dead, int origin, int fanout);

}  // namespace hetobs
