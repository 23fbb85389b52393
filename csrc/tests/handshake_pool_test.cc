// HandshakePool: past its cap of unauthenticated connections it cuts the oldest one, never
// one that authenticated, and stop() cuts the rest and joins every thread.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "hetobs/bootstrap/handshake_pool.h"
#include "native_test.h"

using hetobs::HandshakePool;

namespace {

// The handler a silent stranger meets: wait (bounded) for a byte that never comes.
bool waitForHello(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 20000) <= 0) return false;
  char c;
  return recv(fd, &c, 1, 0) == 1;
}

// Whether the pool's end of this connection was shut down (our read sees EOF at once).
bool cutOff(int client) {
  pollfd p{client, POLLIN, 0};
  if (poll(&p, 1, 2000) <= 0) return false;
  char c;
  return recv(client, &c, 1, MSG_DONTWAIT) == 0;
}

}  // namespace

NATIVE_TEST(handshake_pool_cuts_the_oldest_stranger_past_its_cap) {
  std::vector<int> clients;
  std::atomic<int> started{0};
  {
    HandshakePool pool(3);
    auto give = [&](bool authenticates) {
      int sv[2];
      CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
      clients.push_back(sv[1]);
      pool.run(sv[0], [&, authenticates](int fd, const std::function<void()>& authenticated) {
        if (authenticates) authenticated();
        started.fetch_add(1);
        waitForHello(fd);
        return false;
      });
    };
    give(true);   // 0: authenticated at once: never cut
    while (started.load() < 1) {
    }  // (until it has: before that it is the oldest unauthenticated one)
    give(false);  // 1: oldest stranger
    give(false);  // 2
    give(false);  // 3
    while (started.load() < 4) {
    }
    give(false);  // 4: a fourth stranger: stranger 1 goes
    CHECK(pool.cut() == 1, "one cut, not " + std::to_string(pool.cut()));
    CHECK(cutOff(clients[1]), "the oldest stranger was cut");
    give(false);  // 5: and now stranger 2
    CHECK(cutOff(clients[2]), "then the next oldest");
    pollfd p{clients[0], POLLIN, 0};
    CHECK(poll(&p, 1, 0) == 0, "the authenticated connection is untouched");
    p.fd = clients[3];
    CHECK(poll(&p, 1, 0) == 0, "a younger stranger is untouched");
    CHECK(send(clients[0], "x", 1, MSG_NOSIGNAL) == 1, "the authenticated peer says hello");  // its handler ends
  }  // stop(): the rest are cut (strangers) or finish, and every thread is joined
  CHECK(cutOff(clients[3]) && cutOff(clients[5]), "stop() cut the strangers still waiting");
  for (int c : clients) close(c);
}
