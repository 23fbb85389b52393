/* A stand-in for libcudart.so.12, because this machine has no GPU and no CUDA: just the
 * calls the NCCL interposer and the test application make. Streams are opaque pointers;
 * an event "completes" as soon as it is recorded, unless the fake GPU is stalled
 * (fake_cuda_stall(1)), in which case events recorded during the stall stay not-ready
 * until fake_cuda_stall(0). Elapsed time is the host time between the two records, or
 * FAKE_CUDA_ELAPSED_MS when set. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  int recorded;
  int stalled;
  long long t_ns;
  int device;
} FakeEvent;

static __thread int tl_device = 0;
static volatile int g_stalled = 0;
static void* volatile g_capturing = 0; /* stream in capture mode (fake_cuda_capture) */
static volatile long g_records = 0, g_queries = 0, g_syncs = 0;

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int cudaGetDevice(int* d) { *d = tl_device; return 0; }
int cudaSetDevice(int d) { tl_device = d; return 0; }
int cudaGetLastError(void) { return 0; }
const char* cudaGetErrorString(int e) { return e == 600 ? "cudaErrorNotReady" : "fake cuda error"; }

int cudaEventCreateWithFlags(void** ev, unsigned int flags) {
  (void)flags;
  FakeEvent* e = calloc(1, sizeof *e);
  e->device = tl_device;
  *ev = e;
  return 0;
}
int cudaEventCreate(void** ev) { return cudaEventCreateWithFlags(ev, 0); }
int cudaEventDestroy(void* ev) { free(ev); return 0; }

int cudaEventRecord(void* ev, void* stream) {
  (void)stream;
  FakeEvent* e = ev;
  e->t_ns = now_ns();
  e->stalled = g_stalled;
  e->recorded = 1;
  __sync_fetch_and_add(&g_records, 1);
  return 0;
}

int cudaEventQuery(void* ev) {
  FakeEvent* e = ev;
  __sync_fetch_and_add(&g_queries, 1);
  if (e->recorded && e->stalled && g_stalled) return 600; /* cudaErrorNotReady */
  return 0;
}

/* FAKE_CUDA_ELAPSED_MS: a fixed "GPU" duration, so a test can tell it from host times. */
int cudaEventElapsedTime(float* ms, void* a, void* b) {
  FakeEvent *s = a, *e = b;
  if (!s->recorded || !e->recorded) return 1;
  const char* fixed = getenv("FAKE_CUDA_ELAPSED_MS");
  *ms = fixed ? (float)atof(fixed) : (float)((e->t_ns - s->t_ns) / 1e6);
  return 0;
}

int cudaStreamIsCapturing(void* stream, int* status) {
  *status = (g_capturing && stream == g_capturing) ? 1 : 0;
  return 0;
}

/* What the application itself uses. */
int cudaStreamCreate(void** s) { *s = calloc(1, 64); return 0; }
int cudaStreamSynchronize(void* s) {
  (void)s;
  __sync_fetch_and_add(&g_syncs, 1);
  while (g_stalled) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, 0);
  }
  return 0;
}

/* Enough of the rest for tests/nccl/gpu_app.c to be dry-run against the stand-ins. */
int cudaGetDeviceCount(int* n) { *n = 1; return 0; }
int cudaMalloc(void** p, size_t n) { *p = malloc(n ? n : 1); return *p ? 0 : 2; }
int cudaMemset(void* p, int v, size_t n) { (void)p; (void)v; (void)n; return 0; }
int cudaFree(void* p) { free(p); return 0; }
typedef struct { void (*fn)(void*); void* arg; } HostFn;
static void* runHostFn(void* a) {
  HostFn* h = a;
  h->fn(h->arg);
  g_stalled = 0;
  free(h);
  return 0;
}
/* The stream waits for the host function: events recorded meanwhile stay not-ready. */
int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* arg) {
  (void)stream;
  HostFn* h = malloc(sizeof *h);
  h->fn = fn;
  h->arg = arg;
  g_stalled = 1;
  pthread_t t;
  if (pthread_create(&t, 0, runHostFn, h) != 0) return 1;
  pthread_detach(t);
  return 0;
}

/* Test controls. */
void fake_cuda_stall(int on) { g_stalled = on; }
void fake_cuda_capture(void* stream) { g_capturing = stream; }
long fake_cuda_event_records(void) { return g_records; }
long fake_cuda_stream_syncs(void) { return g_syncs; }

/* What the relay's CUDA copy lanes use (csrc/src/relay/cuda_copy_lane.cc). "Device" memory
 * is host memory here, so cudaMemcpyAsync is a memcpy done at once; the event recorded
 * after it follows the stall rules above, so a test can hold a copy "in flight". The
 * counters let a test check the lane's discipline: copies only on non-blocking streams,
 * pinned staging, never a device-wide synchronisation. */
#define FAKE_STREAM_NONBLOCKING 0x01
typedef struct { unsigned flags; } FakeStream;
static volatile long g_memcpy_async = 0, g_memcpy_async_blocking = 0, g_host_allocs = 0, g_device_syncs = 0;
static volatile long g_event_syncs = 0;

int cudaStreamCreateWithFlags(void** s, unsigned int flags) {
  FakeStream* st = calloc(1, 64);
  st->flags = flags;
  *s = st;
  return 0;
}
int cudaStreamDestroy(void* s) { free(s); return 0; }
int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* stream) {
  (void)kind;
  __sync_fetch_and_add(&g_memcpy_async, 1);
  if (!stream || !(((FakeStream*)stream)->flags & FAKE_STREAM_NONBLOCKING)) __sync_fetch_and_add(&g_memcpy_async_blocking, 1);
  if (n) memcpy(dst, src, n);
  return 0;
}
int cudaEventSynchronize(void* ev) {
  FakeEvent* e = ev;
  __sync_fetch_and_add(&g_event_syncs, 1);
  while (e->recorded && e->stalled && g_stalled) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, 0);
  }
  return 0;
}
int cudaHostAlloc(void** p, size_t n, unsigned int flags) {
  (void)flags;
  __sync_fetch_and_add(&g_host_allocs, 1);
  *p = malloc(n ? n : 1);
  return *p ? 0 : 2;
}
int cudaFreeHost(void* p) { free(p); return 0; }
int cudaDeviceSynchronize(void) { __sync_fetch_and_add(&g_device_syncs, 1); return 0; }

long fake_cuda_memcpy_async(void) { return g_memcpy_async; }
long fake_cuda_memcpy_async_blocking(void) { return g_memcpy_async_blocking; }
long fake_cuda_host_allocs(void) { return g_host_allocs; }
long fake_cuda_device_syncs(void) { return g_device_syncs; }
static volatile long g_stream_waits = 0;
int cudaStreamWaitEvent(void* stream, void* ev, unsigned int flags) {
  (void)stream; (void)ev; (void)flags;
  __sync_fetch_and_add(&g_stream_waits, 1);
  return 0;
}
long fake_cuda_stream_waits(void) { return g_stream_waits; }
