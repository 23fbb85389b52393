#pragma once
// Start-up rendezvous through MASTER_ADDR:MASTER_PORT. Rank 0 hosts it only until
// every rank has sent its card and received the table; then the socket closes and
// nothing depends on rank 0 any more.
#include <string>
#include <vector>

#include "hetobs/bootstrap/handshake.h"
#include "hetobs/common/net.h"

namespace hetobs {

// Returns every rank's encoded card, indexed by rank.
std::vector<std::string> rendezvous(int rank, int size, const SockAddr& master, const Credentials& cred,
                                    const std::string& myCard, int64_t deadlineNs);

}  // namespace hetobs
