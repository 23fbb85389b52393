// One rank of the scale harness (bench/scale/run.py): the native core with no Python, so
// hundreds of ranks fit on one machine. It joins through the ordinary rendezvous
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, HETOBS_*), runs SCALE_OPS ring all_reduces
// (each rank connects to its two ring neighbours on demand), and rank SCALE_HANG_RANK stops
// taking part for SCALE_HANG_SECONDS before op SCALE_HANG_AT: its peers' watchdogs fire and
// the job-wide dump spreads down the side-channel tree.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "hetobs/comm/communicator.h"
#include "hetobs/comm/endpoint.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/error.h"
#include "hetobs/observe/runtime.h"

using namespace hetobs;

namespace {

long envInt(const char* name, long dflt) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  if (*end) {
    fprintf(stderr, "scale_rank: %s='%s': expected an integer\n", name, v);
    exit(2);
  }
  return x;
}

}  // namespace

int main() {
  EnvSettings s;
  std::string why;
  if (!readEnvSettings(&s, &why)) {
    fprintf(stderr, "scale_rank: %s\n", why.c_str());
    return 2;
  }
  applyLogLevel(s);
  const char* master = getenv("MASTER_ADDR");
  int rank = int(envInt("RANK", -1)), size = int(envInt("WORLD_SIZE", -1)), port = int(envInt("MASTER_PORT", -1));
  if (!master || rank < 0 || size < 1 || rank >= size || port <= 0) {
    fprintf(stderr, "scale_rank: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT\n");
    return 2;
  }
  const int ops = int(envInt("SCALE_OPS", 4)), hangRank = int(envInt("SCALE_HANG_RANK", -1));
  const int hangAt = int(envInt("SCALE_HANG_AT", 2)), hangSeconds = int(envInt("SCALE_HANG_SECONDS", 0));
  sigset_t usr2;  // blocked before the runtime's threads start, so all of them inherit it
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, nullptr);
  try {
    CommConfig cfg;
    cfg.rank = rank;
    cfg.size = size;
    cfg.job_id = s.job_id;
    cfg.job_id_generated = s.job_id_generated;
    cfg.secret = s.secret;
    cfg.transport = parseTransport(s.transport);
    cfg.timeout_s = s.timeout;
    cfg.connect_timeout_s = s.connect_timeout;
    cfg.small_bytes = s.small_bytes;
    cfg.watchdog = s.watchdog;
    cfg.observe.dir = s.dir;
    cfg.observe.hang_timeout_s = s.hang_timeout;
    cfg.observe.abort_on_hang = s.abort_on_hang;
    cfg.observe.dump_signal = s.dump_signal;
    cfg.observe.records = s.records;
    auto endpoint = std::make_shared<Endpoint>(cfg);
    std::shared_ptr<Communicator> world = endpoint->rendezvous(master, port);
    // Above HETOBS_SMALL_BYTES and at least one element per rank: the ring algorithm.
    std::vector<float> x(std::max<size_t>(size_t(size), (s.small_bytes / sizeof(float)) + 1024), 1.0f);
    for (int i = 0; i < ops; ++i) {
      if (i == hangAt && rank == hangRank) sleep(unsigned(hangSeconds));  // "computing elsewhere"
      OpArgs a;
      a.op = OpKind::kAllReduce;
      a.dtype = DType::kFloat32;
      a.send = reinterpret_cast<const uint8_t*>(x.data());
      a.recv = reinterpret_cast<uint8_t*>(x.data());
      a.send_count = a.recv_count = x.size();
      world->submit(a, false);
      std::fill(x.begin(), x.end(), 1.0f);
    }
    // Wait for the launcher before closing: a rank that closes its sockets while a
    // neighbour still reads its last frames would fail that neighbour's op.
    sigset_t release;
    sigemptyset(&release);
    sigaddset(&release, SIGUSR2);
    printf("done\n");
    fflush(stdout);
    int sig = 0;
    sigwait(&release, &sig);
    world->close();
    if (Runtime* rt = Runtime::get()) rt->markExit(true);
  } catch (const std::exception& e) {
    fprintf(stderr, "scale_rank %d: %s\n", rank, e.what());
    if (Runtime* rt = Runtime::get()) rt->markExit(false);
    return 1;
  }
  return 0;
}
