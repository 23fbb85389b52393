/* Drives the NCCL profiler plugin's entry points directly, as NCCL would, with a recorded
 * event sequence (no NCCL, no GPU on this machine; no interposer either: the plugin runs
 * alone and keeps the progress under a communicator of its own).
 *
 *   profiler_harness LIB VERSION
 * Communicator: 4 ranks, this is rank 1 (ring neighbours: sends to 2, receives from 0).
 * Phase 1 (then prints PHASE1 and waits for a line on stdin):
 *   channel 0: send op to rank 2, 6 steps: all 6 handed to the network, 3 completed;
 *   channel 1: send op to rank 2, 2 steps: complete (op stopped);
 *   channel 0: recv op from rank 0, 6 steps: 5 arrived, 4 consumed.
 * Phase 2 (then prints PHASE2 and waits): everything finishes; plus what NCCL may send that
 *   must be ignored: null handles, a PXN op of another process, unknown event types.
 * Then finalize, and exit 0 if every call but init returned ncclSuccess. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_driver.h"

static int failures = 0;
#define EXPECT_OK(call)                                                     \
  do {                                                                      \
    ncclResult_t r_ = (call);                                               \
    if (r_ != ncclSuccess) {                                                \
      fprintf(stderr, "%s returned %d\n", #call, r_);                       \
      ++failures;                                                           \
    }                                                                       \
  } while (0)

static void waitLine(const char* tag) {
  printf("%s\n", tag);
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) exit(3);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: profiler_harness LIB VERSION\n");
    return 2;
  }
  TestPlugin tp;
  if (tp_load(&tp, argv[1], atoi(argv[2])) != atoi(argv[2])) return 2;
  printf("PLUGIN %s v%d\n", tp.name, tp.version);

  void* ctx = NULL;
  int mask = 0;
  ncclResult_t r = tp_init(&tp, &ctx, &mask, 0xabcdef12345ull, 4, 1);
  printf("INIT %d MASK %d\n", r, mask);
  if (r != ncclSuccess || !ctx) return 4;
  if (!(mask & ncclProfileProxyOp) || !(mask & ncclProfileProxyStep)) {
    fprintf(stderr, "the plugin did not ask for proxy events\n");
    return 5;
  }

  TpOp send0, send1, recv0;
  tp_op_begin(&send0, &tp, ctx, 1, 2, 1, 0, 6, 1000);
  tp_op_advance(&send0, 6, 3);
  tp_op_begin(&send1, &tp, ctx, 1, 2, 1, 1, 2, 500);
  tp_op_end(&send1);
  tp_op_begin(&recv0, &tp, ctx, 1, 0, 0, 0, 6, 1000);
  tp_op_advance(&recv0, 5, 4);
  if (!send0.op || !recv0.op || !send0.steps[0] || !recv0.steps[0]) {
    fprintf(stderr, "the plugin returned no handle for a proxy op or step\n");
    return 6;
  }
  waitLine("PHASE1");

  tp_op_end(&send0);
  tp_op_end(&recv0);
  /* What must be ignored, and still answered with ncclSuccess. */
  EXPECT_OK(tp_stop(&tp, NULL));
  EXPECT_OK(tp_state(&tp, NULL, ncclProfilerProxyStepSendWait, 8));
  void* h = tp_start(&tp, ctx, ncclProfileProxyOp, NULL, 1, getpid() + 1, 3, 1, 0, 4, 0); /* PXN: not ours */
  if (h) {
    fprintf(stderr, "the plugin took a proxy op of another process\n");
    ++failures;
  }
  h = tp_start(&tp, ctx, ncclProfileProxyStep, NULL, 1, 0, 0, 0, 0, 0, 0); /* step without a parent op */
  if (h) ++failures;
  h = tp_start(&tp, ctx, ncclProfileKernelCh, NULL, 1, 0, 0, 0, 0, 0, 0);
  if (h) EXPECT_OK(tp_stop(&tp, h));
  h = tp_start(&tp, ctx, ncclProfileColl, NULL, 1, 0, 0, 0, 0, 0, 0);
  if (h) EXPECT_OK(tp_stop(&tp, h));
  waitLine("PHASE2");

  EXPECT_OK(tp_finalize(&tp, ctx));
  printf("DONE %d\n", failures);
  return failures ? 1 : 0;
}
