/* The "application" of the NCCL interposer tests: an ordinary NCCL program (it would
 * build against the real nccl.h the same way), run here against the fake libnccl and
 * libcudart because this machine has no GPU, with libhetobs_nccl.so preloaded.
 *
 *   nccl_app RANK NRANKS MODE [SENT ACKED RECEIVED]
 * MODE ops:     the op sequence below, then ncclCommDestroy; prints OPS_DONE, DONE
 * MODE stall:   the sequence, then an allreduce that stalls on the fake GPU and in the
 *               fake proxy (SENT/ACKED/RECEIVED steps on its first channel); prints
 *               STALLED and waits for a line on stdin before it lets the op finish
 * MODE error:   the sequence, then an allreduce NCCL rejects (bad datatype)
 * MODE capture: the sequence, then an allreduce on a stream in CUDA graph capture
 * MODE abort:   the sequence, then a stalled allreduce and ncclCommAbort
 * MODE asyncerr: the sequence, then a stalled allreduce whose communicator then reports an
 *               asynchronous error (as NCCL does when a peer dies); prints STALLED, waits
 * MODE split:   the sequence, then ncclCommSplit (one color) and an allreduce on the child
 * MODE initall: (NRANKS devices in this one process) ncclCommInitAll, then a grouped
 *               allreduce on every communicator; no sequence
 * With NCCL_APP_HOLD=1 it prints HOLD and waits for a line on stdin before it destroys
 * (or after it aborted) the communicator, so a test can read its live state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm* ncclComm_t;
typedef void* cudaStream_t;
enum { ncclInt8 = 0, ncclInt32 = 2, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
enum { ncclSum = 0, ncclMax = 2 };

int ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
int ncclCommDestroy(ncclComm_t comm);
int ncclCommAbort(ncclComm_t comm);
int ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist);
int ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void* config);
int ncclAllReduce(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
int ncclAllGather(const void*, void*, size_t, int, ncclComm_t, cudaStream_t);
int ncclReduceScatter(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
int ncclBroadcast(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
int ncclReduce(const void*, void*, size_t, int, int, int, ncclComm_t, cudaStream_t);
int ncclSend(const void*, size_t, int, int, ncclComm_t, cudaStream_t);
int ncclRecv(void*, size_t, int, int, ncclComm_t, cudaStream_t);
int ncclGroupStart(void);
int ncclGroupEnd(void);
const char* ncclGetErrorString(int);
int cudaSetDevice(int);
int cudaStreamCreate(cudaStream_t*);
int cudaStreamSynchronize(cudaStream_t);
/* fakes' test controls */
void fake_cuda_stall(int on);
void fake_cuda_capture(cudaStream_t s);
void fake_nccl_stall_next(int sent, int acked, int received);
void fake_nccl_release(void);
void fake_nccl_set_async_error(ncclComm_t comm, int err);

static void hold(void) {
  const char* h = getenv("NCCL_APP_HOLD");
  if (!h || strcmp(h, "1") != 0) return;
  printf("HOLD\n");
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) line[0] = 0;
}

#define CHECK(call)                                                              \
  do {                                                                           \
    int r_ = (call);                                                             \
    if (r_ != 0 && r_ != 7) {                                                    \
      fprintf(stderr, "%s failed: %s\n", #call, ncclGetErrorString(r_));         \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: nccl_app RANK NRANKS ops|stall|error|capture|abort [SENT ACKED RECEIVED]\n");
    return 2;
  }
  int rank = atoi(argv[1]), n = atoi(argv[2]);
  const char* mode = argv[3];
  char dummy[64];
  void* buf = dummy;  /* device pointers in a real program; the fakes never touch them */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  strcpy(id.internal, "hetobs-test-comm");  /* every rank agrees (a real job broadcasts ncclGetUniqueId's) */

  cudaSetDevice(0);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  if (strcmp(mode, "initall") == 0) {
    ncclComm_t comms[8];
    if (n > 8) return 2;
    CHECK(ncclCommInitAll(comms, n, NULL));
    CHECK(ncclGroupStart());
    for (int i = 0; i < n; ++i) CHECK(ncclAllReduce(buf, buf, 100, ncclFloat32, ncclSum, comms[i], stream));
    CHECK(ncclGroupEnd());
    cudaStreamSynchronize(stream);
    hold();
    for (int i = 0; i < n; ++i) CHECK(ncclCommDestroy(comms[i]));
    printf("DONE\n");
    return 0;
  }
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));

  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  CHECK(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, stream));
  CHECK(ncclAllGather(buf, buf, 256, ncclFloat32, comm, stream));
  CHECK(ncclReduceScatter(buf, buf, 128, ncclFloat32, ncclSum, comm, stream));
  CHECK(ncclBroadcast(buf, buf, 512, ncclInt32, 0, comm, stream));
  CHECK(ncclReduce(buf, buf, 64, ncclFloat64, ncclMax, n - 1, comm, stream));
  CHECK(ncclGroupStart());
  CHECK(ncclSend(buf, 32, ncclFloat16, next, comm, stream));
  CHECK(ncclRecv(buf, 32, ncclFloat16, prev, comm, stream));
  CHECK(ncclGroupEnd());
  CHECK(ncclAllReduce(buf, buf, 1 << 20, ncclBfloat16, ncclSum, comm, stream));
  cudaStreamSynchronize(stream);
  printf("OPS_DONE\n");
  fflush(stdout);

  if (strcmp(mode, "stall") == 0 || strcmp(mode, "abort") == 0 || strcmp(mode, "asyncerr") == 0) {
    int sent = argc > 4 ? atoi(argv[4]) : 4, acked = argc > 5 ? atoi(argv[5]) : 4,
        received = argc > 6 ? atoi(argv[6]) : 4;
    fake_cuda_stall(1);
    fake_nccl_stall_next(sent, acked, received);
    CHECK(ncclAllReduce(buf, buf, 4096, ncclFloat32, ncclSum, comm, stream));
    if (strcmp(mode, "asyncerr") == 0) fake_nccl_set_async_error(comm, 6 /* ncclRemoteError */);
    printf("STALLED\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) line[0] = 0;
    if (strcmp(mode, "abort") == 0 || strcmp(mode, "asyncerr") == 0) {
      CHECK(ncclCommAbort(comm));
      hold();
      fake_cuda_stall(0);
      printf("DONE\n");
      return 0;
    }
    fake_nccl_release();
    fake_cuda_stall(0);
    cudaStreamSynchronize(stream);
  } else if (strcmp(mode, "error") == 0) {
    int r = ncclAllReduce(buf, buf, 16, 99, ncclSum, comm, stream);
    printf("ERROR_RESULT %d\n", r);
    fflush(stdout);
  } else if (strcmp(mode, "split") == 0) {
    ncclComm_t sub;
    CHECK(ncclCommSplit(comm, 0, rank, &sub, NULL));
    CHECK(ncclAllReduce(buf, buf, 8, ncclFloat32, ncclSum, sub, stream));
    cudaStreamSynchronize(stream);
    hold();
    CHECK(ncclCommDestroy(sub));
  } else if (strcmp(mode, "capture") == 0) {
    fake_cuda_capture(stream);
    CHECK(ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, comm, stream));
    fake_cuda_capture(NULL);
  }
  hold();
  CHECK(ncclCommDestroy(comm));
  printf("DONE\n");
  fflush(stdout);
  return 0;
}
