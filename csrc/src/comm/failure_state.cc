#include "hetobs/comm/failure_state.h"

#include <algorithm>

#include "hetobs/common/error.h"

namespace hetobs {
namespace {

std::string rankList(const std::vector<int>& rs) {
  std::string s;
  for (int r : rs) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

void FailureState::record(const AbortNotice& n, std::string msg, int fromRank, uint64_t failedSeq) {
  cause = std::move(msg);
  notice = n;
  from = fromRank;
  seq = failedSeq;
}

CauseInfo FailureState::causeInfo(const std::vector<int>& world, const OpDesc& op, uint64_t atSeq) const {
  auto global = [&](int r) { return r >= 0 && size_t(r) < world.size() ? world[size_t(r)] : -1; };
  CauseInfo c;
  c.kind = abortKindName(notice.kind);
  c.reporter = global(notice.origin);
  if (from >= 0) c.messengers.push_back(global(from));
  int suspect = global(notice.suspect);
  if (notice.kind == AbortKind::kMismatch) {
    // Only the ranks' vote names deviants; the suspect is one rank's view (no vote: nobody).
    if (voted.load(std::memory_order_acquire)) c.culprits = deviating;
  } else if (notice.kind == AbortKind::kTimeout && from < 0 && !timedOutOn.empty()) {
    for (int p : timedOutOn) c.culprits.push_back(global(p));  // first-hand: every peer it waited on
  } else if (notice.kind == AbortKind::kOther && from >= 0 && c.reporter >= 0) {
    c.culprits.push_back(c.reporter);  // a peer failed for its own reason and told us
  } else if (suspect >= 0 && suspect != c.reporter) {
    c.culprits.push_back(suspect);
  }
  c.op = opName(op.op);
  c.seq = int64_t(atSeq);
  c.peer = suspect;
  c.gone = from < 0 && gonePeer >= 0 && gonePeer == notice.suspect;
  return c;
}

void FailureState::writeAbort(JsonWriter& w, const std::vector<int>& world) const {
  auto rank = [&](const char* key, int commRank) {
    if (commRank >= 0 && size_t(commRank) < world.size()) w.field(key, world[size_t(commRank)]);
    else w.nullField(key);
  };
  w.key("abort").beginObject();
  w.field("kind", abortKindName(notice.kind));
  rank("reporter", notice.origin);
  rank("suspect", notice.suspect);
  rank("received_from", from);
  w.key("deviating").beginArray();
  if (voted.load(std::memory_order_acquire))
    for (int r : deviating) w.value(r);
  w.endArray();
  w.endObject();
}

MismatchVote MismatchVote::tally(const std::map<int, OpDesc>& heard) {
  MismatchVote v;
  for (auto& kv : heard) {
    auto it = std::find_if(v.groups.begin(), v.groups.end(), [&](auto& g) { return g.first == kv.second; });
    if (it == v.groups.end()) v.groups.push_back({kv.second, {kv.first}});
    else it->second.push_back(kv.first);
  }
  std::stable_sort(v.groups.begin(), v.groups.end(),
                   [](auto& a, auto& b) { return a.second.size() > b.second.size(); });
  return v;
}

std::vector<int> MismatchVote::deviating() const {
  std::vector<int> dev;
  for (size_t g = 1; g < groups.size(); ++g) dev.insert(dev.end(), groups[g].second.begin(), groups[g].second.end());
  std::sort(dev.begin(), dev.end());
  return dev;
}

std::string MismatchVote::describe(uint64_t commId, int rank, const std::string& reported) const {
  auto called = [](const std::pair<OpDesc, std::vector<int>>& g) {
    return strFormat("%s %s called %s", g.second.size() > 1 ? "ranks" : "rank", rankList(g.second).c_str(),
                     g.first.str().c_str());
  };
  if (groups.size() == 1)
    return strFormat("op mismatch on comm %llu reported (%s), but every rank heard runs %s (this rank: %d)",
                     (unsigned long long)commId, reported.c_str(), groups[0].first.str().c_str(), rank);
  std::string what;
  if (majority()) {
    for (size_t g = 1; g < groups.size(); ++g) what += (what.empty() ? "" : "; ") + called(groups[g]);
    std::vector<int> dev = deviating();
    return strFormat("op mismatch on comm %llu: deviating %s %s (%s); ranks %s called %s (this rank: %d)",
                     (unsigned long long)commId, dev.size() > 1 ? "ranks" : "rank", rankList(dev).c_str(),
                     what.c_str(), rankList(groups[0].second).c_str(), groups[0].first.str().c_str(), rank);
  }
  size_t heard = 0;
  for (auto& g : groups) {
    what += (what.empty() ? "" : "; ") + called(g);
    heard += g.second.size();
  }
  return strFormat("op mismatch on comm %llu with no majority among the %zu ranks heard (cannot tell which deviated): "
                   "%s (this rank: %d)", (unsigned long long)commId, heard, what.c_str(), rank);
}

}  // namespace hetobs
