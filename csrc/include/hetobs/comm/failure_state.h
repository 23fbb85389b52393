#pragma once
// What a failed communicator remembers and tells (dumps' comms[].abort and cause_info), and the
// vote that decides who deviated in an op mismatch. The op thread writes the fields once,
// before `failed` flips (release); dumps on other threads read them after seeing it set
// (acquire); the vote's deviants likewise behind `voted`.
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hetobs/comm/abort.h"
#include "hetobs/common/json.h"
#include "hetobs/common/wire.h"
#include "hetobs/observe/cause_info.h"
#include "hetobs/transport/channel.h"

namespace hetobs {

struct FailureState {
  std::atomic<bool> failed{false};
  std::string cause;   // the sentence the op raised with (set once, before `failed`)
  AbortNotice notice;  // the failure as data: kind, reporter/origin, suspect
  int from = -1;       // the comm rank whose notice brought the news (-1: seen first-hand)
  uint64_t seq = 0;    // the seq of the op that failed (a mismatch: the seq voted on)
  // Mismatch notices about a later collective than the one running (Communicator::
  // deferLaterMismatch), oldest first: raised by the next op, where the caller deviated or not.
  std::vector<RemoteAbort> deferredMismatch;
  std::vector<int> deviating;  // world ranks the vote found deviating (read once `voted`)
  std::atomic<bool> voted{false};
  int waitedPeer = -1;          // a peer the op still waited on when it timed out (comm rank)
  std::vector<int> timedOutOn;  // every peer it still waited on then, first-hand
  int gonePeer = -1;            // a peer whose process is gone, as the failure found (PeerError::gone)

  // Record the failure (everything but `failed`, which the caller flips when it is ready).
  void record(const AbortNotice& n, std::string msg, int fromRank, uint64_t failedSeq);
  // The failure as data (dump 2.1 cause_info) in world ranks; `op`: the op at `seq`.
  CauseInfo causeInfo(const std::vector<int>& world, const OpDesc& op, uint64_t seq) const;
  // comms[].abort (docs/dump-schema.md), in world ranks.
  void writeAbort(JsonWriter& w, const std::vector<int>& world) const;
};

// Every heard rank's own op at the seq in question, grouped: no rank is the reference, the
// largest group is the majority when it is strictly larger than the next.
struct MismatchVote {
  std::vector<std::pair<OpDesc, std::vector<int>>> groups;  // by op, largest first; comm ranks

  static MismatchVote tally(const std::map<int, OpDesc>& heard);
  bool majority() const { return groups.size() >= 2 && groups[0].second.size() > groups[1].second.size(); }
  // Comm ranks outside the largest group, sorted (meaningful with a majority).
  std::vector<int> deviating() const;
  // The sentence the op raises with. `reported`: the cause of the notice that started the vote.
  std::string describe(uint64_t commId, int rank, const std::string& reported) const;
};

}  // namespace hetobs
