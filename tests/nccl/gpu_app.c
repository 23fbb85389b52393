/* A small real NCCL program for tests/nccl/gpu_check.sh (a machine with a GPU, NCCL and
 * the CUDA runtime): built against the system's nccl.h and cuda_runtime.h, run with
 * libhetobs_nccl.so preloaded and loaded as NCCL's profiler plugin.
 *
 *   gpu_app RANK NRANKS IDFILE
 * Rank 0 writes ncclGetUniqueId's bytes to IDFILE, the others read them. Each rank uses
 * GPU RANK % (GPUs), runs the sequence below, prints OPS_DONE; then blocks its stream for
 * HOLD_S seconds (default 4) with a host function queued before one more allreduce (the
 * op stays in flight without the host waiting: the watchdog must see it through its CUDA
 * event), prints INFLIGHT, waits for the stream, prints DONE. Every rank holds, so every
 * rank is alive, its last op in flight, when the check script reads the stats segments. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA(call)                                                                  \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                   \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)
#define NCCL(call)                                                                  \
  do {                                                                              \
    ncclResult_t r_ = (call);                                                       \
    if (r_ != ncclSuccess) {                                                        \
      fprintf(stderr, "%s: %s\n", #call, ncclGetErrorString(r_));                   \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

static void CUDART_CB hold(void* arg) { sleep(*(unsigned*)arg); }

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: gpu_app RANK NRANKS IDFILE\n");
    return 2;
  }
  int rank = atoi(argv[1]), n = atoi(argv[2]), ndev = 0;
  const char* idfile = argv[3];
  CUDA(cudaGetDeviceCount(&ndev));
  CUDA(cudaSetDevice(rank % ndev));

  ncclUniqueId id;
  if (rank == 0) {
    NCCL(ncclGetUniqueId(&id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", idfile);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, idfile) != 0) return 1;
  } else {
    FILE* f = NULL;
    for (int i = 0; i < 600 && !(f = fopen(idfile, "rb")); ++i) usleep(100000);
    if (!f || fread(&id, sizeof id, 1, f) != 1) return 1;
    fclose(f);
  }
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t stream;
  CUDA(cudaStreamCreate(&stream));
  size_t big = (size_t)16 << 20;  /* floats */
  float *a, *b;
  CUDA(cudaMalloc((void**)&a, big * sizeof(float) * (size_t)n));
  CUDA(cudaMalloc((void**)&b, big * sizeof(float) * (size_t)n));
  CUDA(cudaMemset(a, 0, big * sizeof(float)));

  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  NCCL(ncclAllReduce(a, b, 1 << 20, ncclFloat32, ncclSum, comm, stream));
  NCCL(ncclAllGather(a, b, 1 << 18, ncclFloat32, comm, stream));
  NCCL(ncclReduceScatter(a, b, 1 << 18, ncclFloat32, ncclSum, comm, stream));
  NCCL(ncclBroadcast(a, b, 1 << 19, ncclInt32, 0, comm, stream));
  NCCL(ncclReduce(a, b, 1 << 16, ncclFloat64, ncclMax, n - 1, comm, stream));
  NCCL(ncclGroupStart());
  NCCL(ncclSend(a, 1 << 15, ncclFloat16, next, comm, stream));
  NCCL(ncclRecv(b, 1 << 15, ncclFloat16, prev, comm, stream));
  NCCL(ncclGroupEnd());
  for (int i = 0; i < 10; ++i) NCCL(ncclAllReduce(a, b, big, ncclBfloat16, ncclSum, comm, stream));
  CUDA(cudaStreamSynchronize(stream));
  printf("OPS_DONE\n");
  fflush(stdout);

  unsigned secs = getenv("HOLD_S") ? (unsigned)atoi(getenv("HOLD_S")) : 4;
  CUDA(cudaLaunchHostFunc(stream, hold, &secs));
  NCCL(ncclAllReduce(a, b, 1 << 20, ncclFloat32, ncclSum, comm, stream));
  printf("INFLIGHT\n");
  fflush(stdout);
  CUDA(cudaStreamSynchronize(stream));
  printf("DONE\n");
  fflush(stdout);
  NCCL(ncclCommDestroy(comm));
  CUDA(cudaFree(a));
  CUDA(cudaFree(b));
  return 0;
}
