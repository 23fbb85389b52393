#pragma once
// A data frame's header comes from the peer: a broken, version-skewed or hostile peer can
// put anything there. Before a byte of its payload lands anywhere, each receive path checks
// the header against what this rank posted; a violation is a protocol error (PeerError,
// naming the peer), never a write past a buffer.
#include <cstdint>

#include "hetobs/common/wire.h"
#include "hetobs/transport/channel.h"

namespace hetobs {

// `h` may be received into `item` (the op's description was checked before, with
// checkFrame, and the size against the item's remaining bytes). `maxPayload`: the largest
// frame the receive path can hold; `expectChunk`: the frame number due on this link.
// emptyOk: an empty frame is allowed before the message's end (a shm push offer, single_copy.h).
void checkDataFrame(const PeerInfo& peer, const FrameHeader& h, const RecvItem& item, uint64_t maxPayload,
                    uint64_t expectChunk, const char* link, bool emptyOk = false);

// An ack may confirm no more frames than this rank has sent on the link.
void checkAck(const PeerInfo& peer, uint64_t confirmed, uint64_t sent, const char* link);

}  // namespace hetobs
