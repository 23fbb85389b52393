#include "hetobs/common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "hetobs/common/clock.h"
#include "hetobs/common/connect_retry.h"
#include "hetobs/common/error.h"

namespace hetobs {
namespace {

sockaddr_in resolve(const SockAddr& a) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(a.port));
  if (inet_pton(AF_INET, a.host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(a.host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) throw Error("cannot resolve host '" + a.host + "': " + gai_strerror(rc));
  sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return sa;
}

int waitFd(int fd, short events, int64_t deadlineNs) {
  for (;;) {
    int64_t left = deadlineNs - monoNs();
    if (left <= 0) return 0;
    pollfd p{fd, events, 0};
    // At most a second per poll (left may be 'never', which no int of ms holds), then re-check.
    int rc = poll(&p, 1, int(std::min<int64_t>(left / 1000000 + 1, 1000)));
    if ((rc < 0 && errno == EINTR) || rc == 0) continue;
    return rc;
  }
}

}  // namespace

int listenTcp(const std::string& bindHost, int port, SockAddr* bound, int backlog) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("socket: " + errnoString(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa = resolve(SockAddr{bindHost.empty() ? "0.0.0.0" : bindHost, port});
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    int e = errno;
    close(fd);
    throw Error(strFormat("cannot listen on %s:%d: %s", bindHost.c_str(), port, errnoString(e).c_str()));
  }
  if (listen(fd, backlog) != 0) {
    int e = errno;
    close(fd);
    throw Error("listen: " + errnoString(e));
  }
  if (bound) {
    socklen_t len = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
    bound->host = buf;
    bound->port = ntohs(sa.sin_port);
  }
  return fd;
}

int connectTcp(const SockAddr& addr, int64_t deadlineNs) { return connectWithRetries(ConnectTarget{addr}, deadlineNs); }

std::string localAddressToward(const SockAddr& remote) {
  sockaddr_in sa = resolve(remote);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "127.0.0.1";
  std::string out = "127.0.0.1";
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
      out = buf;
    }
  }
  close(fd);
  return out;
}

void setNonBlocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void setCloseOnExec(int fd) { fcntl(fd, F_SETFD, FD_CLOEXEC); }

void writeFull(int fd, const void* data, size_t len, int64_t deadlineNs, const char* what) {
  const char* p = static_cast<const char*>(data);
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (waitFd(fd, POLLOUT, deadlineNs) <= 0) throw Error(std::string(what) + ": timed out writing");
      continue;
    }
    throw Error(std::string(what) + ": write failed: " + errnoString(errno));
  }
}

void readFull(int fd, void* data, size_t len, int64_t deadlineNs, const char* what) {
  char* p = static_cast<char*>(data);
  while (len) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= size_t(n);
      continue;
    }
    if (n == 0) throw Error(std::string(what) + ": connection closed by peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (waitFd(fd, POLLIN, deadlineNs) <= 0) throw Error(std::string(what) + ": timed out reading");
      continue;
    }
    throw Error(std::string(what) + ": read failed: " + errnoString(errno));
  }
}

void writeBlob(int fd, const std::string& blob, int64_t deadlineNs, const char* what) {
  uint32_t n = uint32_t(blob.size());
  std::string buf(reinterpret_cast<const char*>(&n), 4);
  buf += blob;
  writeFull(fd, buf.data(), buf.size(), deadlineNs, what);
}

std::string readBlob(int fd, size_t maxLen, int64_t deadlineNs, const char* what) {
  uint32_t n = 0;
  readFull(fd, &n, 4, deadlineNs, what);
  if (n > maxLen) throw Error(strFormat("%s: message of %u bytes exceeds the limit of %zu", what, n, maxLen));
  std::string s(n, '\0');
  if (n) readFull(fd, s.data(), n, deadlineNs, what);
  return s;
}

std::string peerAddressOf(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "?";
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(sa.sin_port));
}

namespace {

struct IfAddr {
  std::string name, ip;
  bool loopback;
};

std::vector<IfAddr> ipv4Interfaces() {
  std::vector<IfAddr> out;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) throw Error("getifaddrs: " + errnoString(errno));
  for (ifaddrs* a = all; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    out.push_back(IfAddr{a->ifa_name, buf, (a->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(all);
  return out;
}

bool matchesAny(const std::string& name, const std::vector<std::string>& specs, bool exact) {
  for (const std::string& s : specs)
    if (exact ? name == s : name.compare(0, s.size(), s) == 0) return true;
  return false;
}

bool isLocalAddress(const std::string& ip) {
  for (const IfAddr& a : ipv4Interfaces())
    if (a.ip == ip) return true;
  return false;
}

}  // namespace

std::string interfaceAddress(const std::string& spec) {
  // NCCL_SOCKET_IFNAME's grammar: comma-separated prefixes; '=' first: exact names; '^' first:
  // any interface but those (loopback too, unless it was named).
  std::string rest = spec;
  bool exclude = !rest.empty() && rest[0] == '^';
  if (exclude) rest.erase(0, 1);
  bool exact = !rest.empty() && rest[0] == '=';
  if (exact) rest.erase(0, 1);
  std::vector<std::string> names;
  for (size_t pos = 0; pos <= rest.size();) {
    size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    if (comma > pos) names.push_back(rest.substr(pos, comma - pos));
    pos = comma + 1;
  }
  if (names.empty()) throw Error("HETOBS_SOCKET_IFNAME='" + spec + "': names no interface");
  std::vector<IfAddr> all = ipv4Interfaces();
  for (const IfAddr& a : all) {
    bool hit = matchesAny(a.name, names, exact);
    if (exclude ? (!hit && !a.loopback) : hit) return a.ip;
  }
  std::string have;
  for (const IfAddr& a : all) have += (have.empty() ? "" : ", ") + a.name + " " + a.ip;
  throw Error("HETOBS_SOCKET_IFNAME='" + spec + "': no IPv4 interface that is up matches (this host has: " +
              (have.empty() ? std::string("none") : have) + ")");
}

std::string listenAddressFor(const std::string& ifnameSpec, const std::string& towardHost) {
  if (!ifnameSpec.empty()) return interfaceAddress(ifnameSpec);
  if (!towardHost.empty()) return localAddressToward(SockAddr{towardHost, 9});  // a route look-up: nothing is sent
  return "0.0.0.0";
}

std::string outwardAddress(const std::string& towardHost) {
  try {
    // A route look-up only (a UDP connect sends nothing); TEST-NET-1 stands for "anywhere".
    std::string ip = localAddressToward(SockAddr{towardHost.empty() ? std::string("192.0.2.1") : towardHost, 9});
    // Toward a named host the route's answer stands, loopback included (a job on one host).
    if (!towardHost.empty() || ip != "127.0.0.1") return ip;
  } catch (const std::exception&) {
    // no route: fall through to the interfaces
  }
  try {
    for (const IfAddr& a : ipv4Interfaces())
      if (!a.loopback) return a.ip;
  } catch (const std::exception&) {
    // getifaddrs failed: loopback is all that is left
  }
  return "127.0.0.1";
}

std::string rendezvousListenAddress(const std::string& masterHost) {
  // Others reach the rendezvous at MASTER_ADDR: bind that when it is one of ours (behind a NAT
  // or a proxy it is not, and only the wildcard can take its connections).
  std::string ip;
  try {
    char buf[INET_ADDRSTRLEN];
    sockaddr_in sa = resolve(SockAddr{masterHost, 0});
    inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
    ip = buf;
  } catch (const Error&) {
    return "0.0.0.0";
  }
  return isLocalAddress(ip) ? ip : "0.0.0.0";
}

}  // namespace hetobs
