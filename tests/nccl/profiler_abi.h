/* The NCCL profiler plugin ABI (v4, v5/v6) as NCCL's plugins/profiler/README.md documents
 * it, written out in full for the test programs that play NCCL's part: the fake libnccl
 * and the plugin harness. Deliberately separate from csrc/interpose/nccl/nccl_api.h (the
 * plugin's own, partial declarations): a layout slip in either shows up as wrong counts.
 * Stand-ins only because this machine has no GPU and no NCCL. */
#ifndef HETOBS_TEST_PROFILER_ABI_H
#define HETOBS_TEST_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclSystemError = 2, ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5,
       ncclInProgress = 7 };

enum {
  ncclProfileGroup = 1 << 0, ncclProfileColl = 1 << 1, ncclProfileP2p = 1 << 2, ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4, ncclProfileProxyCtrl = 1 << 5, ncclProfileKernelCh = 1 << 6,
  ncclProfileNetPlugin = 1 << 7, ncclProfileGroupApi = 1 << 8, ncclProfileCollApi = 1 << 9,
  ncclProfileP2pApi = 1 << 10, ncclProfileKernelLaunch = 1 << 11,
};

typedef enum {
  ncclProfilerProxyOpSendPosted = 0, ncclProfilerProxyOpSendRemFifoWait = 1, ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3, ncclProfilerProxyOpRecvPosted = 4, ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6, ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyStepSendGPUWait = 8, ncclProfilerProxyStepSendWait = 9, ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11, ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13, ncclProfilerProxyCtrlActive = 14, ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16, ncclProfilerProxyCtrlAppend = 17, ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerProxyOpInProgress_v4 = 19, ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerNetPluginUpdate = 21, ncclProfilerKernelChStop = 22,
} ncclProfilerEventState_t;

typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

#define TEST_PROXY_UNION_COMMON                                                                          \
  struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;     \
  struct { int step; } proxyStep;                                                                         \
  struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                                                \
  struct { int64_t id; void* data; } netPlugin;

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    TEST_PROXY_UNION_COMMON
    struct { uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff; size_t count; int root;
             const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto; } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels; } p2p;
  };
} ncclProfilerEventDescr_v4_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    TEST_PROXY_UNION_COMMON
    struct { bool graphCaptured; int groupDepth; } groupApi;
    struct { const char* func; size_t count; const char* datatype; int root; void* stream; bool graphCaptured; } collApi;
    struct { const char* func; size_t count; const char* datatype; void* stream; bool graphCaptured; } p2pApi;
    struct { void* stream; } kernelLaunch;
    struct { uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff; size_t count; int root;
             const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto;
             void* parentGroup; } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels;
             void* parentGroup; } p2p;
  };
} ncclProfilerEventDescr_v5_t;

typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} ncclProfilerEventStateArgs_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;  /* v6 has the same functions; its descriptor extends v5's union */

/* One loaded plugin, whichever version the library offers (newest first, as NCCL does),
 * behind version-neutral calls. */
typedef struct {
  int version;
  const char* name;
  ncclProfiler_v4_t* v4;
  ncclProfiler_v5_t* v5;
} TestPlugin;

#endif
