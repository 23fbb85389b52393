#pragma once
// The abort notice a failing rank sends every peer, so that nobody waits for data
// that will never come and every rank reports the root cause, not "peer closed".
// For op mismatches it carries the sender's own op, so ranks can take a majority
// vote on who deviated instead of trusting any one rank.
#include <string>

#include "hetobs/common/wire.h"

namespace hetobs {

enum class AbortKind { kPeer, kMismatch, kTimeout, kOther };

struct AbortNotice {
  AbortKind kind = AbortKind::kOther;
  int reporter = -1;      // comm rank that sent the notice
  OpDesc reporter_desc;   // the op the reporter was running
  int suspect = -1;       // mismatch: the peer whose frame disagreed, if seen first-hand
  OpDesc suspect_desc;
  std::string cause;      // root cause, human-readable

  std::string encode() const;
  static AbortNotice decode(const std::string& body);  // tolerant: unknown text becomes the cause
};

}  // namespace hetobs
