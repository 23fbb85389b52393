#pragma once
// The abort notice a failing rank sends every peer, so that nobody waits for data
// that will never come and every rank reports the root cause, not "peer closed".
// For op mismatches it carries the sender's own op, so ranks can take a majority
// vote on who deviated instead of trusting any one rank. Its kind, origin and
// suspect also go into the dumps (docs/dump-schema.md, comms[].abort), so the
// diagnosis reads who failed and whom it blames as data, not from the message.
#include <string>

#include "hetobs/common/wire.h"

namespace hetobs {

// Values travel on the wire: append, never renumber.
enum class AbortKind { kPeer, kMismatch, kTimeout, kOther, kTransport };

// The dump's name of a kind: "peer_closed", "mismatch", "timeout", "other", "transport".
const char* abortKindName(AbortKind k);

struct AbortNotice {
  AbortKind kind = AbortKind::kOther;  // kPeer: a peer closed its connection; kTransport: a link broke
  int reporter = -1;      // comm rank that sent the notice
  OpDesc reporter_desc;   // the op the reporter was running
  int suspect = -1;       // the rank the failure points at (mismatch: the peer whose frame disagreed,
                          // if seen first-hand; peer/transport: the other end of the failed link;
                          // timeout: a peer the op still waited on); kept when forwarded
  OpDesc suspect_desc;    // mismatch only
  int origin = -1;        // comm rank that saw the failure first-hand; kept when forwarded
  std::string cause;      // root cause, human-readable

  std::string encode() const;
  static AbortNotice decode(const std::string& body);  // tolerant: unknown text becomes the cause
};

}  // namespace hetobs
