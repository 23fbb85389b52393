#pragma once
// Pieces of the dump's "comms" entries (docs/dump-schema.md) shared by every Observed:
// the native Communicator, ExternalComm and the NCCL interposer's communicator.
#include <cstdint>
#include <string>
#include <vector>

#include "hetobs/common/json.h"
#include "hetobs/record/op_record.h"
#include "hetobs/record/progress.h"

namespace hetobs {

void writeRankList(JsonWriter& w, const char* key, const std::vector<int>& ranks);
void writeWallTimeOrNull(JsonWriter& w, const char* key, int64_t monoNs);
// The fields of an "in_flight" object that come from its op record (the caller opens the
// object and adds "peers").
void writeInFlightFields(JsonWriter& w, const OpRecord& r, int64_t startMono, int64_t nowMono);
// A hierarchical op's "island" and, with `phases`, its "phases" object; nothing for other ops.
void writeIslandFields(JsonWriter& w, const OpRecord& r, bool phases);
// One element of "peers": progress of the op in flight toward one peer.
void writePeerProgress(JsonWriter& w, int peer, int globalPeer, const char* transport, const PeerProgress& p,
                       int64_t nowMono);
// One element of "links": cumulative counters of one link.
void writeLinkCounters(JsonWriter& w, int peer, int globalPeer, const char* transport, const LinkCounters& k,
                       const std::string& localAddress, const std::string& remoteAddress);

}  // namespace hetobs
