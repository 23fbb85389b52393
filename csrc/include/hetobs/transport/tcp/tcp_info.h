#pragma once
// Reading a TCP connection's kernel state (TCP_INFO) into a LinkHealth. One getsockopt,
// no allocation, no lock: safe from any thread while the owner thread uses the socket.
#include "hetobs/record/link_health.h"

namespace hetobs {
namespace tcp {

// false (and `out` unchanged) when fd is no TCP socket or the call fails.
bool sampleTcpInfo(int fd, LinkHealth& out);

}  // namespace tcp
}  // namespace hetobs
