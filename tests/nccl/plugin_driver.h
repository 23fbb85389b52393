/* Drive an NCCL profiler plugin the way NCCL does: load it (NCCL_PROFILER_PLUGIN rules),
 * call init per communicator, and walk proxy operations through the event sequence of
 * NCCL's network transport:
 *   send op: start -> InProgress; each step: start -> SendGPUWait -> SendPeerWait -> SendWait(size) -> stop; op stop
 *   recv op: start -> InProgress; each step: start -> RecvWait -> RecvFlushWait(size) -> RecvGPUWait -> stop; op stop
 * Shared by the fake libnccl and the plugin harness (test stand-ins: no GPU, no NCCL here). */
#ifndef HETOBS_TEST_PLUGIN_DRIVER_H
#define HETOBS_TEST_PLUGIN_DRIVER_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "profiler_abi.h"

#define TP_MAX_STEPS 8

/* NCCL_PROFILER_PLUGIN: unset or "none" -> no plugin; a path is used as given, a name N
 * becomes libnccl-profiler-N.so. wantVersion 0: the newest of v6, v5, v4. */
static int tp_load(TestPlugin* tp, const char* env, int wantVersion) {
  memset(tp, 0, sizeof *tp);
  if (!env || !*env || strcasecmp(env, "none") == 0) return 0;
  char name[4096];
  if (strchr(env, '/')) snprintf(name, sizeof name, "%s", env);
  else snprintf(name, sizeof name, "libnccl-profiler-%s.so", env);
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "fake nccl: cannot load profiler plugin %s: %s\n", name, dlerror());
    return 0;
  }
  for (int v = 6; v >= 4; --v) {
    if (wantVersion && v != wantVersion) continue;
    char sym[32];
    snprintf(sym, sizeof sym, "ncclProfiler_v%d", v);
    void* s = dlsym(lib, sym);
    if (!s) continue;
    tp->version = v;
    if (v == 4) tp->v4 = (ncclProfiler_v4_t*)s;
    else tp->v5 = (ncclProfiler_v5_t*)s;
    tp->name = v == 4 ? tp->v4->name : tp->v5->name;
    return v;
  }
  fprintf(stderr, "fake nccl: %s has no ncclProfiler_v%d\n", name, wantVersion);
  return 0;
}

static ncclResult_t tp_init(TestPlugin* tp, void** ctx, int* mask, uint64_t hash, int nranks, int rank) {
  if (tp->version == 4) return tp->v4->init(ctx, mask, "fake", hash, 1, nranks, rank, NULL);
  return tp->v5->init(ctx, hash, mask, "fake", 1, nranks, rank, NULL);
}

static ncclResult_t tp_finalize(TestPlugin* tp, void* ctx) {
  return tp->version == 4 ? tp->v4->finalize(ctx) : tp->v5->finalize(ctx);
}

static ncclResult_t tp_stop(TestPlugin* tp, void* h) {
  return tp->version == 4 ? tp->v4->stopEvent(h) : tp->v5->stopEvent(h);
}

static ncclResult_t tp_state(TestPlugin* tp, void* h, ncclProfilerEventState_t st, size_t transSize) {
  ncclProfilerEventStateArgs_t a;
  memset(&a, 0, sizeof a);
  a.proxyStep.transSize = transSize;
  return tp->version == 4 ? tp->v4->recordEventState(h, st, &a) : tp->v5->recordEventState(h, st, &a);
}

/* Start an event of `type`; proxyOp fields used for ncclProfileProxyOp, step for ProxyStep. */
static void* tp_start(TestPlugin* tp, void* ctx, uint64_t type, void* parent, int rank, pid_t pid, int peer,
                      int isSend, int channel, int nSteps, int step) {
  void* h = NULL;
  ncclResult_t r;
  if (tp->version == 4) {
    ncclProfilerEventDescr_v4_t d;
    memset(&d, 0, sizeof d);
    d.type = (uint8_t)type;
    d.parentObj = parent;
    d.rank = rank;
    if (type == ncclProfileProxyOp) {
      d.proxyOp.pid = pid; d.proxyOp.channelId = (uint8_t)channel; d.proxyOp.peer = peer;
      d.proxyOp.nSteps = nSteps; d.proxyOp.chunkSize = 1 << 19; d.proxyOp.isSend = isSend;
    } else if (type == ncclProfileProxyStep) {
      d.proxyStep.step = step;
    }
    r = tp->v4->startEvent(ctx, &h, &d);
  } else {
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof d);
    d.type = type;
    d.parentObj = parent;
    d.rank = rank;
    if (type == ncclProfileProxyOp) {
      d.proxyOp.pid = pid; d.proxyOp.channelId = (uint8_t)channel; d.proxyOp.peer = peer;
      d.proxyOp.nSteps = nSteps; d.proxyOp.chunkSize = 1 << 19; d.proxyOp.isSend = isSend;
    } else if (type == ncclProfileProxyStep) {
      d.proxyStep.step = step;
    } else if (type == ncclProfileCollApi) {
      d.collApi.func = "AllReduce"; d.collApi.count = 1; d.collApi.datatype = "ncclFloat32";
    } else if (type == ncclProfileP2pApi) {
      d.p2pApi.func = "Send"; d.p2pApi.count = 1; d.p2pApi.datatype = "ncclFloat32";
    }
    r = tp->v5->startEvent(ctx, &h, &d);
  }
  if (r != ncclSuccess) fprintf(stderr, "plugin startEvent returned %d (only init may fail)\n", r);
  return h;
}

/* One proxy operation (a channel's transfer to or from one peer) and its steps. */
typedef struct {
  TestPlugin* tp;
  void* ctx;
  void* op;
  void* steps[TP_MAX_STEPS];
  int rank, peer, isSend, nsteps;
  int started, moved, done;  /* steps started; sent (send) or received (recv); stopped */
  size_t stepBytes;
} TpOp;

static void tp_op_begin(TpOp* t, TestPlugin* tp, void* ctx, int rank, int peer, int isSend, int channel, int nsteps,
                        size_t stepBytes) {
  memset(t, 0, sizeof *t);
  t->tp = tp; t->ctx = ctx; t->rank = rank; t->peer = peer; t->isSend = isSend; t->nsteps = nsteps;
  t->stepBytes = stepBytes;
  t->op = tp_start(tp, ctx, ncclProfileProxyOp, NULL, rank, getpid(), peer, isSend, channel, nsteps, 0);
  tp_state(tp, t->op, ncclProfilerProxyOpInProgress_v4, 0);
}

/* Move the op forward until `moved` steps were sent/received and `done` were stopped. */
static void tp_op_advance(TpOp* t, int moved, int done) {
  if (moved > t->nsteps) moved = t->nsteps;
  if (done > moved) done = moved;
  while (t->started < moved) {
    int s = t->started++;
    t->steps[s] = tp_start(t->tp, t->ctx, ncclProfileProxyStep, t->op, t->rank, 0, 0, 0, 0, 0, s);
    if (t->isSend) {
      tp_state(t->tp, t->steps[s], ncclProfilerProxyStepSendGPUWait, 0);
    } else {
      tp_state(t->tp, t->steps[s], ncclProfilerProxyStepRecvWait, 0);
    }
  }
  while (t->moved < moved) {
    int s = t->moved++;
    if (t->isSend) {
      tp_state(t->tp, t->steps[s], ncclProfilerProxyStepSendPeerWait_v4, 0);
      tp_state(t->tp, t->steps[s], ncclProfilerProxyStepSendWait, t->stepBytes);
    } else {
      tp_state(t->tp, t->steps[s], ncclProfilerProxyStepRecvFlushWait, t->stepBytes);
      tp_state(t->tp, t->steps[s], ncclProfilerProxyStepRecvGPUWait, 0);
    }
  }
  while (t->done < done) tp_stop(t->tp, t->steps[t->done++]);
}

static void tp_op_end(TpOp* t) {
  tp_op_advance(t, t->nsteps, t->nsteps);
  tp_stop(t->tp, t->op);
  t->op = NULL;
}

#endif
