#pragma once
// The few NCCL, CUDA runtime and NCCL profiler-plugin declarations that hetobs's NCCL
// interposer and profiler plugin use, written from the documented APIs: NCCL's user
// guide (nccl.h: communicator and collective calls, result/type/op enums), the CUDA
// runtime API reference (events, devices, stream capture) and NCCL's profiler plugin
// documentation (plugins/profiler/README.md: the ncclProfiler_vN structs, event type
// bits, proxy step states, event descriptors). No NCCL or CUDA header is included or
// copied, so the build needs neither; the real functions are found at run time
// (dlsym(RTLD_NEXT) for NCCL, dlopen of libcudart).
//
// Only what is used is declared. Enums whose values cross the ABI are given their
// documented numbers; descriptor structs declare only the union members read here,
// laid out as documented (static_asserts below pin the offsets).
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

extern "C" {

// ---------------------------------------------------------------- NCCL (nccl.h)
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
  ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11,
} ncclDataType_t;

// Values above ncclAvg are user-defined reductions (ncclRedOpCreatePreMulSum).
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

struct ncclComm;
typedef struct ncclComm* ncclComm_t;
#define HETOBS_NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[HETOBS_NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
struct hetobsNcclConfig;  // ncclConfig_t: only ever passed through by pointer
typedef struct hetobsNcclConfig ncclConfig_t;

// ---------------------------------------------------------------- CUDA runtime
struct CUstream_st;
struct CUevent_st;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorNotReady = 600 };
enum { cudaEventDefault = 0 };  // timing enabled (we read elapsed times)
typedef enum {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
} cudaStreamCaptureStatus;

// ---------------------------------------------------------------- NCCL profiler plugin ABI
// Event type bits (eActivationMask and eDescr->type).
enum {
  ncclProfileGroup = 1 << 0,
  ncclProfileColl = 1 << 1,
  ncclProfileP2p = 1 << 2,
  ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4,
  ncclProfileProxyCtrl = 1 << 5,
  ncclProfileKernelCh = 1 << 6,
  ncclProfileNetPlugin = 1 << 7,
  ncclProfileGroupApi = 1 << 8,   // v5
  ncclProfileCollApi = 1 << 9,    // v5
  ncclProfileP2pApi = 1 << 10,    // v5
  ncclProfileKernelLaunch = 1 << 11,  // v5
};

// The states recordEventState reports for the events we activate.
typedef enum {
  ncclProfilerProxyStepSendGPUWait = 8,       // send step posted to the GPU, waiting for its data
  ncclProfilerProxyStepSendWait = 9,          // send step handed to the network, waiting for completion
  ncclProfilerProxyStepRecvWait = 10,         // receive posted to the network, waiting for data
  ncclProfilerProxyStepRecvFlushWait = 11,    // data arrived, waiting for the flush to the GPU
  ncclProfilerProxyStepRecvGPUWait = 12,      // handed to the GPU, waiting for it to consume the data
  ncclProfilerProxyOpInProgress_v4 = 19,      // proxy op started progressing
  ncclProfilerProxyStepSendPeerWait_v4 = 20,  // send data ready, waiting for the peer's clear-to-send
} ncclProfilerEventState_t;

typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

// Proxy operation / step descriptors, identical in v4, v5 and v6.
struct hetobsProxyOpDescr {
  pid_t pid;          // process that created the op (PXN: another process's proxy may run it)
  uint8_t channelId;
  int peer;           // communicator rank of the remote side
  int nSteps;         // network transfers in this op
  int chunkSize;
  int isSend;
};
struct hetobsProxyStepDescr {
  int step;
};

typedef struct {
  uint8_t type;     // v4: one byte
  void* parentObj;  // handle this plugin returned for the parent event
  int rank;
  union {
    hetobsProxyOpDescr proxyOp;
    hetobsProxyStepDescr proxyStep;
    void* pointerAligned_;  // the documented union holds pointer members: it starts pointer-aligned
  };
} ncclProfilerEventDescr_v4_t;

// v5 (and v6, which only adds union members at the same offsets).
typedef struct {
  uint64_t type;    // v5: eight bytes
  void* parentObj;
  int rank;
  union {
    hetobsProxyOpDescr proxyOp;
    hetobsProxyStepDescr proxyStep;
    void* pointerAligned_;
  };
} ncclProfilerEventDescr_v5_t;

typedef union {
  struct {
    size_t transSize;  // bytes of this network transfer
  } proxyStep;
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
} ncclProfiler_v5_t;

typedef ncclProfiler_v5_t ncclProfiler_v6_t;  // same function signatures; v6 descriptors extend v5's union

}  // extern "C"

// The documented layouts (x86-64 / aarch64 LP64): the union starts after type, parentObj, rank.
static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
static_assert(offsetof(ncclProfilerEventDescr_v4_t, parentObj) == 8, "v4 descriptor layout");
static_assert(offsetof(ncclProfilerEventDescr_v4_t, proxyOp) == 24, "v4 descriptor layout");
static_assert(offsetof(ncclProfilerEventDescr_v5_t, proxyOp) == 24, "v5 descriptor layout");
static_assert(offsetof(hetobsProxyOpDescr, peer) == 8 && offsetof(hetobsProxyOpDescr, isSend) == 20,
              "proxyOp descriptor layout");
