#pragma once
// Exception hierarchy of the native core. Every message names what failed and,
// where a peer is involved, which peer (rank, host) and which op: that detail is
// what turns "timeout" into a diagnosis.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hetobs {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A peer died, closed, or its connection failed mid-op.
class PeerError : public Error {
 public:
  using Error::Error;
  PeerError(const std::string& msg, int peer, bool closed) : Error(msg), peer(peer), closed(closed) {}
  int peer = -1;        // comm rank on the other end of the failed link (-1: not known)
  bool closed = false;  // it closed the connection (else the link broke: I/O or protocol error)
  bool gone = false;    // its process is gone: its listener refused every dial (reconnect.cc)
};
// Ranks disagree on the op at one sequence id.
class MismatchError : public Error {
 public:
  using Error::Error;
};
// An op waited past its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};
// The communicator failed before; it refuses further ops.
class AbortedError : public Error {
 public:
  using Error::Error;
};
// Ranks' results of one collective differ (HETOBS_DIGEST, collectives/digest.h): the op
// finished, but some rank's copy of what must be identical everywhere is not.
class DataMismatchError : public Error {
 public:
  DataMismatchError(const std::string& msg, std::vector<int> ranks, std::string op, uint64_t comm, uint64_t seq,
                    int64_t element)
      : Error(msg), ranks(std::move(ranks)), op(std::move(op)), comm(comm), seq(seq), element(element) {}
  std::vector<int> ranks;  // world ranks whose result differs from the majority's (every rank: no majority)
  std::string op;
  uint64_t comm = 0, seq = 0;
  int64_t element = -1;  // the first differing element (-1: not found)
};
// Handshake authentication failed.
class AuthError : public Error {
 public:
  using Error::Error;
};

std::string errnoString(int err);
std::string strFormat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace hetobs

#define HETOBS_ENFORCE(cond, ...)                                                  \
  do {                                                                             \
    if (!(cond))                                                                   \
      throw ::hetobs::Error(::hetobs::strFormat(__VA_ARGS__) + " [" __FILE__ ":" + \
                            std::to_string(__LINE__) + "]");                       \
  } while (0)
