// Cost of recording one op (begin + start + finish) on the hot path, in ns.
// Prints one JSON object so `hetobs bench --recorder` and docs/PERF.md can use it.
#include <cstdio>
#include <cstdlib>

#include "hetobs/common/clock.h"
#include "hetobs/common/wire.h"
#include "hetobs/record/recorder.h"

using namespace hetobs;

int main(int argc, char** argv) {
  long iters = argc > 1 ? atol(argv[1]) : 2000000;
  Recorder& r = Recorder::instance();
  r.configure(2048);
  OpRecord init{};
  init.op = uint8_t(OpKind::kAllReduce);
  init.dtype = uint8_t(DType::kFloat32);
  init.comm_size = 4;
  init.bytes = 1024;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    int64_t t0 = monoNs();
    for (long i = 0; i < iters; ++i) {
      int64_t now = monoNs();
      init.t_enqueue_ns = now;
      uint64_t id = r.begin(init);
      r.markStarted(id, now);
      r.markFinished(id, monoNs(), true, nullptr);
    }
    double ns = double(monoNs() - t0) / double(iters);
    if (ns < best) best = ns;
  }
  printf("{\"ns_per_op\": %.1f, \"iterations\": %ld, \"capacity\": %zu}\n", best, iters, r.capacity());
  return 0;
}
