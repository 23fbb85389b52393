#pragma once
// Socket helpers for set-up paths (rendezvous, handshakes). Data paths use the
// non-blocking transports instead. Every blocking call takes a deadline.
#include <cstddef>
#include <cstdint>
#include <string>

namespace hetobs {

struct SockAddr {
  std::string host;
  int port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

// Listen on bindHost:port (port 0 = any). Returns the fd; *bound gets the real address.
int listenTcp(const std::string& bindHost, int port, SockAddr* bound, int backlog = 128);
// Connect, retrying refused/unreachable until deadlineNs (monotonic). Throws Error naming the address.
int connectTcp(const SockAddr& addr, int64_t deadlineNs);
// The local IP address this host uses to reach `remote` (for advertising our listener).
std::string localAddressToward(const SockAddr& remote);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);
void setCloseOnExec(int fd);

// Blocking full read/write bounded by deadlineNs; throw Error("what: ...") on EOF/timeout/error.
void writeFull(int fd, const void* data, size_t len, int64_t deadlineNs, const char* what);
void readFull(int fd, void* data, size_t len, int64_t deadlineNs, const char* what);
// Length-prefixed blob (u32 length, at most maxLen) for set-up messages.
void writeBlob(int fd, const std::string& blob, int64_t deadlineNs, const char* what);
std::string readBlob(int fd, size_t maxLen, int64_t deadlineNs, const char* what);

std::string peerAddressOf(int fd);

// Where a rank's listeners bind (never the wildcard when the way to the job is known): the
// IPv4 address of the interface `ifnameSpec` names (HETOBS_SOCKET_IFNAME, NCCL_SOCKET_IFNAME's
// grammar: "eth" prefix, "=eth0" exact, "^docker,lo" exclusion, comma lists), else the local
// address the kernel uses toward `towardHost` (MASTER_ADDR: `ip route get` semantics), else
// 0.0.0.0 when neither is known. Throws Error naming HETOBS_SOCKET_IFNAME when nothing matches.
std::string listenAddressFor(const std::string& ifnameSpec, const std::string& towardHost);
std::string interfaceAddress(const std::string& ifnameSpec);
// An address peers can dial when no interface is named (never the wildcard): the one the
// kernel uses toward `towardHost` (MASTER_ADDR) when given, else the default route's, else
// the first IPv4 interface that is up and not loopback, else 127.0.0.1.
std::string outwardAddress(const std::string& towardHost);
// Where rank 0's rendezvous binds: MASTER_ADDR itself when it is an address of this host.
std::string rendezvousListenAddress(const std::string& masterHost);

}  // namespace hetobs
