#include "hetobs/observe/dump_tree.h"

#include <algorithm>
#include <mutex>
#include <thread>

namespace hetobs {

std::vector<SpreadInterval> spreadChunks(SpreadInterval iv, int fanout) {
  std::vector<SpreadInterval> out;
  int lo = iv.lo + 1, rest = iv.hi - lo;
  if (rest <= 0) return out;
  int parts = std::min(std::max(fanout, 1), rest);
  int base = rest / parts, extra = rest % parts;
  for (int i = 0; i < parts; ++i) {
    int len = base + (i < extra ? 1 : 0);
    out.push_back(SpreadInterval{lo, lo + len});
    lo += len;
  }
  return out;
}

SpreadOutcome spreadRequests(int origin, int n, SpreadInterval mine, int fanout,
                             const std::function<bool(int, SpreadInterval)>& ask) {
  SpreadOutcome out;
  std::mutex mu;
  // One chunk, and on no answer the chunk's own chunks, depth first in this thread.
  std::function<void(SpreadInterval)> hand = [&](SpreadInterval chunk) {
    int rank = spreadRank(origin, chunk.lo, n);
    bool ok = ask(rank, chunk);
    {
      std::lock_guard<std::mutex> g(mu);
      out.asked.push_back(rank);
      (ok ? out.answered : out.unanswered).push_back(rank);
    }
    if (!ok)
      for (SpreadInterval sub : spreadChunks(chunk, fanout)) hand(sub);
  };
  std::vector<std::thread> threads;
  for (SpreadInterval chunk : spreadChunks(mine, fanout)) threads.emplace_back([&hand, chunk] { hand(chunk); });
  for (auto& t : threads) t.join();
  return out;
}

SpreadSimulation simulateSpread(int n, const std::vector<uint8_t>& dead, int origin, int fanout) {
  SpreadSimulation sim;
  if (n <= 0) return sim;
  std::vector<uint8_t> got(size_t(n), 0);
  got[size_t(origin % n)] = 1;
  sim.reached = 1;
  // A pending send: the chunk to ask for (its head receives it, or its sender takes it over).
  std::vector<SpreadInterval> now = spreadChunks(SpreadInterval{0, n}, fanout), next;
  while (!now.empty()) {
    ++sim.rounds;
    next.clear();
    for (SpreadInterval chunk : now) {
      ++sim.messages;
      size_t rank = size_t(spreadRank(origin, chunk.lo, n));
      bool isDead = dead.size() == size_t(n) && dead[rank];
      if (!isDead) {
        if (got[rank]) ++sim.duplicates;
        else ++sim.reached;
        got[rank] = 1;
      }
      for (SpreadInterval sub : spreadChunks(chunk, fanout)) next.push_back(sub);
    }
    now.swap(next);
  }
  return sim;
}

}  // namespace hetobs
