#pragma once
// Connecting to a peer that may not listen yet (a late rank 0) or whose network flickers:
// attempts with exponential back-off (10 ms doubling to 1 s, +-25 % jitter so a whole job
// does not knock in step), at most HETOBS_CONNECT_RETRIES attempts, and never past the
// caller's deadline (HETOBS_CONNECT_TIMEOUT stays the overall bound). Every connect path
// (rendezvous, data links, side channel, reconnects) calls this one function.
#include <cstdint>
#include <string>

#include "hetobs/common/error.h"
#include "hetobs/common/net.h"

namespace hetobs {

// The last attempt failed: names the peer, its address and how many attempts were made.
class ConnectError : public PeerError {
 public:
  ConnectError(const std::string& msg, int peer, std::string address, int attempts, int err)
      : PeerError(msg, peer, false), address(std::move(address)), attempts(attempts), err(err) {}
  std::string address;  // "ip:port"
  int attempts;
  int err;              // errno of the last attempt (ECONNREFUSED: nobody listens there)
  int64_t refused_ns = 0;  // how long the attempts had been refused in a row when it gave up (0: the last was not)
};

struct ConnectTarget {
  SockAddr addr;
  int peer = -1;        // rank of the peer in the caller's numbering, -1 if not a rank
  std::string what;     // "rank 0's rendezvous", "rank 3's side channel", ...
};

struct RetryLimits {
  int attempts = 0;              // 0: HETOBS_CONNECT_RETRIES
  int64_t refused_for_ns = -1;   // >= 0: a refusal repeated this long ends the tries (peer gone)
};

// Connected, blocking, TCP_NODELAY fd; throws ConnectError after the last attempt.
int connectWithRetries(const ConnectTarget& target, int64_t deadlineNs, RetryLimits limits = {});

// Back-off before attempt `attempt` (2, 3, ...), jittered; exposed for the reconnect loop.
int64_t retryBackoffNs(int attempt);

}  // namespace hetobs
