#pragma once
// A source of send/recv items that changes while they move: Communicator::exchangeFed
// drives the feed's current window over the channels and asks it, each turn, to retire
// finished items and admit ready ones (the relay pipeline admits a chunk once its
// staging copy is done, and hands a received chunk to its copy-out).
#include <cstddef>
#include <cstdint>

#include "hetobs/transport/channel.h"

namespace hetobs {

class ExchangeFeed {
 public:
  virtual ~ExchangeFeed() = default;
  // Retire done items, admit ready ones; true if anything changed.
  virtual bool pump() = 0;
  virtual bool finished() const = 0;
  virtual SendItem* sends(size_t* n) = 0;
  virtual RecvItem* recvs(size_t* n) = 0;
  // Copies are outstanding: the loop also waits for them, not only for the links.
  virtual bool copying() const = 0;
  // A counter that moves when a copy completes (read before pump(), then wait on it).
  virtual uint32_t copySeq() const = 0;
  // Sleep until copySeq() != seen or timeoutNs passed.
  virtual void waitCopies(uint32_t seen, int64_t timeoutNs) = 0;
};

}  // namespace hetobs
