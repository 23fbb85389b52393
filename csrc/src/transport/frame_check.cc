#include "hetobs/transport/frame_check.h"

#include "hetobs/common/error.h"

namespace hetobs {
namespace {

[[noreturn]] void protocolError(const PeerInfo& peer, const char* link, const std::string& what) {
  throw PeerError(strFormat("protocol error on the %s from %s: %s", link, peer.describe().c_str(), what.c_str()),
                  peer.rank, false);
}

}  // namespace

void checkDataFrame(const PeerInfo& peer, const FrameHeader& h, const RecvItem& item, uint64_t maxPayload,
                    uint64_t expectChunk, const char* link, bool emptyOk) {
  if (h.chunk != expectChunk)
    protocolError(peer, link, strFormat("data frame number %llu arrived where %llu was due",
                                        (unsigned long long)h.chunk, (unsigned long long)expectChunk));
  if (h.bytes > maxPayload)
    protocolError(peer, link, strFormat("data frame of %llu bytes (at most %llu are sent in one frame)",
                                        (unsigned long long)h.bytes, (unsigned long long)maxPayload));
  // Senders cut a message into non-empty frames; only an empty message has an empty frame.
  if (h.bytes == 0 && item.offset < item.len && !emptyOk)
    protocolError(peer, link, strFormat("empty data frame with %zu bytes of the message still due",
                                        item.len - item.offset));
  if (item.mode == RecvMode::kReduce && h.bytes % dtypeSize(item.dtype) != 0)
    protocolError(peer, link, strFormat("data frame of %llu bytes is not a whole number of %s elements",
                                        (unsigned long long)h.bytes, dtypeName(item.dtype)));
}

void checkAck(const PeerInfo& peer, uint64_t confirmed, uint64_t sent, const char* link) {
  if (confirmed > sent)
    protocolError(peer, link, strFormat("ack of %llu frames, only %llu were sent", (unsigned long long)confirmed,
                                        (unsigned long long)sent));
}

}  // namespace hetobs
