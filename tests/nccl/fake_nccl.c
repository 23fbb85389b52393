/* A stand-in for libnccl.so.2, because this machine has no GPU and no NCCL: the public
 * calls the interposer wraps, with NCCL's profiler-plugin behaviour (plugin_driver.h).
 * No data moves. Each collective on a communicator of n > 1 ranks plays a ring on two
 * channels: per channel one proxy send op to rank+1 and one proxy recv op from rank-1,
 * 4 network steps each; ncclSend/ncclRecv play one op to/from the peer. The plugin sees
 * these events inline, on the calling thread.
 *
 * Controls (for the test application):
 *   fake_nccl_stall_next(sent, acked, received): the next collective stops part-way on one
 *     channel (send: `sent` steps handed to the network, `acked` completed; recv: `received`
 *     steps arrived) and stays there until fake_nccl_release();
 *   FAKE_NCCL_OP_US: host time each op takes inside the call (default 200);
 *   FAKE_NCCL_PROFILER_VERSION: the ncclProfiler_vN symbol to use (default: newest offered);
 *   FAKE_NCCL_NONBLOCKING=1: calls return ncclInProgress and ncclCommGetAsyncError says
 *     ncclInProgress three times before ncclSuccess (a non-blocking communicator). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "plugin_driver.h"

typedef struct { char internal[128]; } ncclUniqueId;

#define STEPS 4
#define CHANNELS 2

struct ncclComm {
  int nranks, rank, dev;
  uint64_t hash;
  void* ctx;
  volatile int pendingPolls; /* non-blocking: GetAsyncError answers InProgress this many more times */
  int asyncError;
  TpOp stalled[2];
  int nstalled;
};
typedef struct ncclComm* ncclComm_t;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static TestPlugin g_tp;
static int g_mask;
static int g_nonblocking;
static int g_opUs = 200;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { int armed, sent, acked, received; } g_stall;
static ncclComm_t g_stalledComm;

static void loadOnce(void) {
  const char* v = getenv("FAKE_NCCL_PROFILER_VERSION");
  tp_load(&g_tp, getenv("NCCL_PROFILER_PLUGIN"), v ? atoi(v) : 0);
  g_nonblocking = getenv("FAKE_NCCL_NONBLOCKING") && atoi(getenv("FAKE_NCCL_NONBLOCKING"));
  if (getenv("FAKE_NCCL_OP_US")) g_opUs = atoi(getenv("FAKE_NCCL_OP_US"));
}

static uint64_t hashId(const ncclUniqueId* id) {
  uint64_t h = 5381;
  for (int i = 0; i < 128; ++i) h = h * 33 ^ (unsigned char)id->internal[i];
  return h;
}

static ncclResult_t result(ncclComm_t c) {
  if (!g_nonblocking) return ncclSuccess;
  if (c) c->pendingPolls = 3;
  return ncclInProgress;
}

static ncclResult_t newComm(ncclComm_t* out, int nranks, int rank, uint64_t hash, int dev) {
  pthread_once(&g_once, loadOnce);
  if (!out || nranks <= 0 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  ncclComm_t c = calloc(1, sizeof *c);
  c->nranks = nranks;
  c->rank = rank;
  c->hash = hash;
  c->dev = dev;
  if (g_tp.version) {
    ncclResult_t r = tp_init(&g_tp, &c->ctx, &g_mask, hash, nranks, rank);
    if (r != ncclSuccess) {
      fprintf(stderr, "fake nccl: profiler plugin %s init failed (%d); continuing without it\n", g_tp.name, r);
      memset(&g_tp, 0, sizeof g_tp);
      c->ctx = NULL;
    }
  }
  *out = c;
  return result(c);
}

static void apiEvent(ncclComm_t c, uint64_t type) {
  if (g_tp.version >= 5 && (g_mask & type)) {
    void* h = tp_start(&g_tp, c->ctx, type, NULL, c->rank, 0, 0, 0, 0, 0, 0);
    if (h) tp_stop(&g_tp, h);
  }
}

static void simulate(void) {
  if (g_opUs > 0) usleep((useconds_t)g_opUs);
}

static void collective(ncclComm_t c, size_t bytes) {
  apiEvent(c, ncclProfileCollApi);
  simulate();
  if (!g_tp.version || !c->ctx || !(g_mask & ncclProfileProxyOp) || c->nranks < 2) return;
  int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
  size_t stepBytes = bytes / (CHANNELS * STEPS) + 1;
  pthread_mutex_lock(&g_mu);
  int stall = g_stall.armed;
  g_stall.armed = 0;
  pthread_mutex_unlock(&g_mu);
  if (stall) {  /* channel 0 stops part-way and stays so until fake_nccl_release() */
    tp_op_begin(&c->stalled[0], &g_tp, c->ctx, c->rank, next, 1, 0, STEPS, stepBytes);
    tp_op_advance(&c->stalled[0], g_stall.sent, g_stall.acked);
    tp_op_begin(&c->stalled[1], &g_tp, c->ctx, c->rank, prev, 0, 0, STEPS, stepBytes);
    tp_op_advance(&c->stalled[1], g_stall.received, g_stall.received);
    c->nstalled = 2;
    g_stalledComm = c;
    return;
  }
  for (int ch = 0; ch < CHANNELS; ++ch) {
    TpOp s, r;
    tp_op_begin(&s, &g_tp, c->ctx, c->rank, next, 1, ch, STEPS, stepBytes);
    tp_op_begin(&r, &g_tp, c->ctx, c->rank, prev, 0, ch, STEPS, stepBytes);
    tp_op_end(&s);
    tp_op_end(&r);
  }
}

static void p2p(ncclComm_t c, int isSend, int peer, size_t bytes) {
  apiEvent(c, ncclProfileP2pApi);
  simulate();
  if (!g_tp.version || !c->ctx || !(g_mask & ncclProfileProxyOp) || peer == c->rank) return;
  TpOp t;
  tp_op_begin(&t, &g_tp, c->ctx, c->rank, peer, isSend, 0, STEPS, bytes / STEPS + 1);
  tp_op_end(&t);
}

static size_t typeSize(int dt) {
  static const size_t k[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return dt >= 0 && dt < 12 ? k[dt] : 1;
}

/* ------------------------------------------------------------------ the NCCL API */

ncclResult_t ncclGetVersion(int* v) { *v = 22805; return ncclSuccess; }
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error (fake)";
    case 6: return "remote process exited or there was a network error (fake)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "fake nccl error";
  }
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-nccl-%d", (int)getpid());
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* c, int nranks, ncclUniqueId id, int rank) {
  return newComm(c, nranks, rank, hashId(&id), 0);
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* c, int nranks, ncclUniqueId id, int rank, void* config) {
  (void)config;
  return newComm(c, nranks, rank, hashId(&id), 0);
}
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  for (int i = 0; i < ndev; ++i) {
    ncclResult_t r = newComm(&comms[i], ndev, i, 0x1a11u + (uint64_t)getpid(), devlist ? devlist[i] : i);
    if (r != ncclSuccess && r != ncclInProgress) return r;
  }
  return result(NULL);
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void* config) {
  (void)key; (void)config;
  if (color < 0) {
    *newcomm = NULL;
    return ncclSuccess;
  }
  return newComm(newcomm, comm->nranks, comm->rank, comm->hash * 31 + (uint64_t)color, comm->dev);
}
static ncclResult_t closeComm(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  if (g_tp.version && c->ctx) tp_finalize(&g_tp, c->ctx);
  free(c);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) { return closeComm(c); }
ncclResult_t ncclCommAbort(ncclComm_t c) { return closeComm(c); }
ncclResult_t ncclCommCount(ncclComm_t c, int* n) { *n = c->nranks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(ncclComm_t c, int* r) { *r = c->rank; return ncclSuccess; }
ncclResult_t ncclCommCuDevice(ncclComm_t c, int* d) { *d = c->dev; return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) {
  if (c->asyncError) *e = c->asyncError;
  else if (c->pendingPolls > 0) { c->pendingPolls--; *e = ncclInProgress; }
  else *e = ncclSuccess;
  return ncclSuccess;
}

static __thread int tl_group;
ncclResult_t ncclGroupStart(void) { ++tl_group; return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) {
  if (tl_group > 0) --tl_group;
  return result(NULL);
}

ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, int dt, int op, ncclComm_t c, void* stream) {
  (void)s; (void)r; (void)op; (void)stream;
  if (dt < 0 || dt > 11) return ncclInvalidArgument;
  collective(c, count * typeSize(dt));
  return result(c);
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t count, int dt, ncclComm_t c, void* stream) {
  (void)s; (void)r; (void)stream;
  collective(c, count * typeSize(dt) * (size_t)c->nranks);
  return result(c);
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t count, int dt, int op, ncclComm_t c, void* stream) {
  (void)s; (void)r; (void)op; (void)stream;
  collective(c, count * typeSize(dt) * (size_t)c->nranks);
  return result(c);
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t count, int dt, int root, ncclComm_t c, void* stream) {
  (void)s; (void)r; (void)root; (void)stream;
  collective(c, count * typeSize(dt));
  return result(c);
}
ncclResult_t ncclBcast(void* b, size_t count, int dt, int root, ncclComm_t c, void* stream) {
  return ncclBroadcast(b, b, count, dt, root, c, stream);
}
ncclResult_t ncclReduce(const void* s, void* r, size_t count, int dt, int op, int root, ncclComm_t c, void* stream) {
  (void)s; (void)r; (void)op; (void)root; (void)stream;
  collective(c, count * typeSize(dt));
  return result(c);
}
ncclResult_t ncclSend(const void* s, size_t count, int dt, int peer, ncclComm_t c, void* stream) {
  (void)s; (void)stream;
  p2p(c, 1, peer, count * typeSize(dt));
  return result(c);
}
ncclResult_t ncclRecv(void* r, size_t count, int dt, int peer, ncclComm_t c, void* stream) {
  (void)r; (void)stream;
  p2p(c, 0, peer, count * typeSize(dt));
  return result(c);
}

/* ------------------------------------------------------------------ test controls */

void fake_nccl_stall_next(int sent, int acked, int received) {
  pthread_mutex_lock(&g_mu);
  g_stall.armed = 1;
  g_stall.sent = sent;
  g_stall.acked = acked;
  g_stall.received = received;
  pthread_mutex_unlock(&g_mu);
}

void fake_nccl_release(void) {
  ncclComm_t c = g_stalledComm;
  if (!c) return;
  for (int i = 0; i < c->nstalled; ++i) tp_op_end(&c->stalled[i]);
  c->nstalled = 0;
  g_stalledComm = NULL;
}

void fake_nccl_set_async_error(ncclComm_t c, int err) { c->asyncError = err; }
const char* fake_nccl_plugin_name(void) { return g_tp.version ? g_tp.name : ""; }
int fake_nccl_plugin_version(void) { return g_tp.version; }
