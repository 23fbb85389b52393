// A dump (the watchdog, a peer's request) reads a communicator's channels while the
// communicator closes: the reader must never walk freed channels.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "hetobs/comm/communicator.h"
#include "hetobs/comm/endpoint.h"
#include "hetobs/common/json.h"
#include "hetobs/common/net.h"
#include "native_test.h"

using namespace hetobs;

namespace {

int freePort() {
  SockAddr bound;
  int fd = listenTcp("127.0.0.1", 0, &bound);
  ::close(fd);
  return bound.port;
}

CommConfig configFor(int rank, const std::string& job) {
  CommConfig c;
  c.rank = rank;
  c.size = 2;
  c.job_id = job;
  c.secret = "native-test-secret";
  c.transport = TransportChoice::kTcp;
  c.watchdog = false;  // no runtime: this test reads the communicator itself, as dumps do
  c.connect_timeout_s = 20;
  return c;
}

// Everything a dump and the watchdog read from a communicator.
void observe(const Communicator& c) {
  JsonWriter w;
  c.writeMetadata(w);
  c.writeState(w, 0);
  Observed::InFlight f;
  c.inFlight(&f);
  (void)c.links();
}

}  // namespace

NATIVE_TEST(communicator_close_while_dumping) {
  for (int round = 0; round < 12; ++round) {
    std::string job = "native-close-" + std::to_string(getpid()) + "-" + std::to_string(round);
    int port = freePort();
    std::shared_ptr<Communicator> comms[2];
    std::shared_ptr<Endpoint> eps[2];
    std::thread ranks[2];
    for (int r = 0; r < 2; ++r)
      ranks[r] = std::thread([&, r] {
        eps[r] = std::make_shared<Endpoint>(configFor(r, job));
        comms[r] = eps[r]->rendezvous("127.0.0.1", port);
      });
    for (auto& t : ranks) t.join();
    CHECK(comms[0] && comms[1], "both ranks connected");
    if (!comms[0] || !comms[1]) return;
    std::atomic<bool> closed{false};
    std::atomic<uint64_t> reads{0};
    std::vector<std::thread> readers;
    for (int r = 0; r < 2; ++r)
      readers.emplace_back([&, r] {
        std::shared_ptr<Communicator> c = comms[r];  // the runtime keeps its comms alive the same way
        do {
          observe(*c);
          reads.fetch_add(1);
        } while (!closed.load());
        observe(*c);  // after close: no channels, still no crash
      });
    while (reads.load() < 4) std::this_thread::yield();  // the readers are inside before the close
    for (auto& c : comms) c->close();
    closed.store(true);
    for (auto& t : readers) t.join();
  }
}
