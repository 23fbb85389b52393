#pragma once
// Start-up rendezvous through MASTER_ADDR:MASTER_PORT. Rank 0 hosts it only until
// every rank has sent its card and received the table; then the socket closes and
// nothing depends on rank 0 any more.
//
// Rank 0 also hands out the job id: right after each handshake it sends its own, and the
// rank adopts it (`onJobId`) before sending its card, so the ranks of one job agree on one
// id even when none was set (torchrun's static rendezvous says TORCHELASTIC_RUN_ID=none).
#include <functional>
#include <string>
#include <vector>

#include "hetobs/bootstrap/handshake.h"
#include "hetobs/common/net.h"

namespace hetobs {

// Returns every rank's encoded card, indexed by rank.
// `jobId`: what rank 0 hands out; `onJobId` runs on ranks > 0 with rank 0's id (it may throw
// Error to refuse it: the rendezvous then fails with that message).
std::vector<std::string> rendezvous(int rank, int size, const SockAddr& master, const Credentials& cred,
                                    const std::string& jobId,
                                    const std::function<void(const std::string&)>& onJobId,
                                    const std::string& myCard, int64_t deadlineNs);

}  // namespace hetobs
