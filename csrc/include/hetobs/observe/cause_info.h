#pragma once
// A failure or a hang as data (dump 2.1 "cause_info", docs/dump-schema.md): the dump's
// `cause` sentence is for people; the diagnosis reads these fields and never the sentence.
#include <cstdint>
#include <string>
#include <vector>

namespace hetobs {

struct CauseInfo {
  // hang (the watchdog saw no progress) | peer_closed | transport | mismatch | timeout | other |
  // data_mismatch (ranks' results of one collective differ: HETOBS_DIGEST);
  // empty: no cause to tell (the dump is written as `"cause_info": null`).
  std::string kind;
  std::vector<int> culprits;    // global ranks the failure blames (never a mere messenger)
  int reporter = -1;            // global rank that saw it first-hand
  std::vector<int> messengers;  // global ranks that only forwarded the news to this rank
  std::string op;               // the op that failed or hung ("" unknown)
  int64_t seq = -1;             // its sequence id: collective seq, or p2p seq for p2p ops (-1 unknown)
  int peer = -1;                // the global rank on the other end (link, awaited peer, p2p peer); -1 none
  bool gone = false;            // first-hand: `peer`'s listener refused every redial (its process is gone?)
  // data_mismatch (collectives/digest.h) only; written when set: the communicator and the
  // first element whose value differs between the ranks.
  int64_t comm = -1;
  int64_t element = -1;

  bool empty() const { return kind.empty(); }
};

}  // namespace hetobs
