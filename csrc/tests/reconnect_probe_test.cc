// Reconnector (acceptor side) against a dying peer: its listener first accepts the probe
// into the backlog and drops it (the process is being torn down), then refuses. The death
// must be named as soon as the refusals have lasted their window (1.5 s across hosts), not
// a full re-probe interval later: waiting 0.5 s after the dropped probe made a killed rank
// on a slow machine fail in 2.04 s instead of 1.54 s.
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "hetobs/bootstrap/listener.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/net.h"
#include "hetobs/transport/tcp/reconnect.h"
#include "native_test.h"

using namespace hetobs;

NATIVE_TEST(reconnect_names_a_dying_peer_once_its_refusals_last_their_window) {
  Credentials cred{"reconnect-probe-test", "reconnect-probe-test"};
  Listener ours(cred, "127.0.0.1");

  SockAddr peerAddr;
  int peerListen = listenTcp("127.0.0.1", 0, &peerAddr);
  int64_t closedAt = 0;
  std::thread dying([&] {
    int probe = accept(peerListen, nullptr, nullptr);  // the first probe gets in ...
    closedAt = monoNs();
    if (probe >= 0) ::close(probe);                    // ... and is dropped
    ::close(peerListen);                               // from now on: refused
  });

  tcp::ReconnectPlan plan;
  plan.comm_id = 7;
  plan.my_rank = 0;  // the lower rank: it awaits the redial and probes
  plan.peer_rank = 1;
  plan.my_host = "a";
  plan.peer_listener = peerAddr;
  plan.cred = cred;
  plan.listener = &ours;
  plan.timeout_s = 30;
  plan.same_host = false;  // refusals must last 1.5 s before they mean death
  tcp::Reconnector reconnector(plan);
  PeerInfo peer;
  peer.rank = 1;
  peer.host = "b";
  bool gone = false;
  try {
    reconnector.remake(1, monoNs() + 30000000000LL, peer, "test", "", "");
  } catch (const PeerError& e) {
    gone = e.gone;
  }
  int64_t endNs = monoNs();
  dying.join();  // before reading closedAt: the thread wrote it (ThreadSanitizer saw the race)
  int64_t tookNs = endNs - closedAt;
  CHECK(gone, "the dying peer was not named gone");
  // 1.5 s of refusals plus one short re-probe; the old 0.5 s wait gave >= 2.0 s.
  CHECK(tookNs < 1800000000LL, "named gone " + std::to_string(tookNs / 1000000) + " ms after the drop");
}
