#pragma once
// Exception hierarchy of the native core. Every message names what failed and,
// where a peer is involved, which peer (rank, host) and which op: that detail is
// what turns "timeout" into a diagnosis.
#include <stdexcept>
#include <string>

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
