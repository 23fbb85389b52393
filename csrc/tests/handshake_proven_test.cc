// Start-up at scale (issue 28): a handshake is marked proven before its answer goes out, so
// the pool can never cut a connection its client already acts on; a pool sized to the job lets
// every peer of a 128-rank host wait at once; a server that drops a client unanswered is
// "dropped" (dial again), not a refusal; a listener answers "closed" for a closed communicator.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "hetobs/bootstrap/handshake.h"
#include "hetobs/bootstrap/handshake_pool.h"
#include "hetobs/bootstrap/listener.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/net.h"
#include "native_test.h"

using namespace hetobs;

namespace {
const Credentials kCred{"handshake-proven-test", "handshake-proven-test"};
int64_t soon() { return monoNs() + 10000000000LL; }
}  // namespace

NATIVE_TEST(handshake_is_proven_before_the_client_hears_the_answer) {
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
  std::atomic<bool> clientDone{false};
  bool answeredBeforeProven = true;
  std::thread client([&] {
    Hello h;
    h.purpose = Purpose::kTransport;
    h.comm_id = 5;
    h.from_rank = 3;
    h.to_rank = 1;
    clientHandshake(sv[1], kCred, h, soon());
    clientDone.store(true);
  });
  Hello got = serverHandshake(sv[0], kCred, soon(), [&](const Hello& x) {
    answeredBeforeProven = clientDone.load();  // the client cannot be done: no answer went out yet
    CHECK(x.comm_id == 5 && x.from_rank == 3, "the proven hook sees the client's hello");
    return kHandshakeAccepted;
  });
  client.join();
  CHECK(!answeredBeforeProven, "the client finished its handshake before the server marked it proven");
  CHECK(clientDone.load() && got.from_rank == 3, "handshake completed");
  close(sv[0]);
  close(sv[1]);
}

NATIVE_TEST(a_server_that_drops_the_client_unanswered_is_not_a_refusal) {
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
  close(sv[0]);  // the server gave up before saying anything
  bool dropped = false, auth = false;
  try {
    clientHandshake(sv[1], kCred, Hello{}, soon());
  } catch (const HandshakeDropped&) {
    dropped = true;
  } catch (const AuthError&) {
    auth = true;
  }
  CHECK(dropped && !auth, "a dropped handshake must be HandshakeDropped (dial again), not an AuthError");
  close(sv[1]);
}

NATIVE_TEST(a_pool_sized_to_the_job_holds_every_peer_of_a_host_at_once) {
  constexpr size_t kPeers = 127;  // a 128-rank host: every other rank dials rank 0 at once
  std::vector<int> clients;
  std::atomic<int> started{0};
  {
    HandshakePool pool(pendingBudget(kPeers));
    for (size_t i = 0; i < kPeers; ++i) {
      int sv[2];
      CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
      clients.push_back(sv[1]);
      pool.run(sv[0], [&](int fd, const std::function<void()>&) {
        started.fetch_add(1);
        char c;
        return recv(fd, &c, 1, 0) < 0;  // waits (unproven) until its client speaks or the pool cuts it
      });
    }
    while (started.load() < int(kPeers)) std::this_thread::yield();
    CHECK(pool.cut() == 0, std::to_string(pool.cut()) + " legitimate connections cut");
    for (int c : clients) CHECK(send(c, "x", 1, MSG_NOSIGNAL) == 1, "the peer speaks");
  }
  for (int c : clients) close(c);
}

NATIVE_TEST(a_closed_communicator_is_said_to_redials_and_probes) {
  Listener listener(kCred, "127.0.0.1", 1);
  SockAddr at{"127.0.0.1", listener.port()};
  listener.markClosed(9);
  auto ask = [&](Purpose purpose, uint64_t comm, int from) {
    Hello h;
    h.purpose = purpose;
    h.comm_id = comm;
    h.from_rank = from;
    h.to_rank = 0;
    h.generation = purpose == Purpose::kTransport ? 1 : 0;
    int fd = connectTcp(at, soon());
    try {
      clientHandshake(fd, kCred, h, soon());
    } catch (const CommClosedError&) {
      close(fd);
      return 2;
    }
    close(fd);
    return 0;
  };
  CHECK(ask(Purpose::kTransport, 9, 1) == 2, "a redial for a closed communicator hears 'closed'");
  CHECK(ask(Purpose::kProbe, 9, 1) == 2, "a reconnect probe about it hears 'closed'");
  CHECK(ask(Purpose::kProbe, 0, -1) == 0, "a plain liveness probe is accepted");
  CHECK(ask(Purpose::kTransport, 10, 1) == 0, "another communicator's connection is accepted");
  int fd = listener.take(10, 1, soon());
  CHECK(fd >= 0, "and parked for it");
  close(fd);
}
