#include "hetobs/common/net.h"

#include <arpa/inet.h>
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

#include "hetobs/common/clock.h"
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

int connectTcp(const SockAddr& addr, int64_t deadlineNs) {
  sockaddr_in sa = resolve(addr);
  int64_t backoffMs = 10;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw Error("socket: " + errnoString(errno));
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      if (waitFd(fd, POLLOUT, deadlineNs) > 0) {
        socklen_t l = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
      } else {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) {
      setNonBlocking(fd, false);
      setNoDelay(fd);
      return fd;
    }
    close(fd);
    if (monoNs() + backoffMs * 1000000 >= deadlineNs)
      throw Error(strFormat("cannot connect to %s: %s (gave up at the connect deadline)", addr.str().c_str(),
                            errnoString(err).c_str()));
    usleep(useconds_t(backoffMs * 1000));  // retry back-off: the peer may not listen yet
    backoffMs = backoffMs * 2 > 500 ? 500 : backoffMs * 2;
  }
}

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

}  // namespace hetobs
