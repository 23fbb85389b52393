#pragma once
// Pieces of the dump's "comms" entries (docs/dump-schema.md) shared by every Observed:
// the native Communicator, ExternalComm and the NCCL interposer's communicator.
#include <cstdint>
#include <string>
#include <vector>

#include "hetobs/common/json.h"
#include "hetobs/observe/cause_info.h"
#include "hetobs/observe/observed.h"
#include "hetobs/record/link_health.h"
#include "hetobs/record/op_record.h"
#include "hetobs/record/progress.h"

namespace hetobs {

struct ReconnectHistory;  // transport/channel.h

void writeRankList(JsonWriter& w, const char* key, const std::vector<int>& ranks);
// `key`: the cause as data ({kind, culprits, reporter, messengers, op, seq, peer, gone}), or null
// when it is empty (dump 2.1).
void writeCauseInfo(JsonWriter& w, const char* key, const CauseInfo& c);
// An in-flight op's "waiting_on" (dump 2.1): [{rank, direction, posted, done}], global ranks.
void writeWaitingOn(JsonWriter& w, const std::vector<WaitedPeer>& waits);
// Append to `out` each direction of `p` with messages posted and not done (peer `globalRank`).
void addWaits(std::vector<WaitedPeer>* out, int globalRank, const PeerProgress& p);
// The distinct ranks of `waits`, in order of first appearance.
std::vector<int> waitedRanks(const std::vector<WaitedPeer>& waits);
void writeWallTimeOrNull(JsonWriter& w, const char* key, int64_t monoNs);
// The fields of an "in_flight" object that come from its op record (the caller opens the
// object and adds "peers").
void writeInFlightFields(JsonWriter& w, const OpRecord& r, int64_t startMono, int64_t nowMono);
// A hierarchical op's "island" and, with `phases`, its "phases" object; nothing for other ops.
void writeIslandFields(JsonWriter& w, const OpRecord& r, bool phases);
// Content hash of a communicator's membership and ring (16 hex digits of SHA-256 over
// "global_ranks=0,1,2;ring=0,1,2"); hetobs/diagnosis/membership.py computes the same.
std::string membershipHash(const std::vector<int>& members, const std::vector<int>& ring);
// A comm entry's "membership": {"hash", "lowest_rank"} in place of the lists themselves, which
// live once per communicator in comms/comm-<id>-<hash>.json. `publish` (rank metadata):
// the lowest member writes that file, once per process.
void writeMembership(JsonWriter& w, uint64_t commId, const std::vector<int>& members, const std::vector<int>& ring,
                     bool publish);
// Which peers get a section, so a dump does not grow with the communicator: those the op in
// flight has touched, those a link carried data to or from, and the ring neighbours (the
// ring walk needs both ends even before the first frame).
bool peerHasProgress(const PeerProgress& p);
bool linkCarriedData(const LinkCounters& k);
bool ringNeighbour(int commRank, int peer, int size);
// One element of "peers": progress of the op in flight toward one peer.
void writePeerProgress(JsonWriter& w, int peer, int globalPeer, const char* transport, const PeerProgress& p,
                       int64_t nowMono);
// One element of "links": cumulative counters of one link; `reconnects`: times a TCP link was
// re-made after a break (0 where links never reconnect); its "tcp" health when `health` holds
// a sample (null otherwise).
// `history`: the link's reconnect record ("reconnect"; null when nullptr or the link never broke).
void writeLinkCounters(JsonWriter& w, int peer, int globalPeer, const char* transport, const LinkCounters& k,
                       const std::string& localAddress, const std::string& remoteAddress, uint64_t reconnects = 0,
                       const LinkHealth* health = nullptr, const ReconnectHistory* history = nullptr);

}  // namespace hetobs
