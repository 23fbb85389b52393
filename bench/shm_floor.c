// The floor under a shared-memory all_reduce on this machine: what one core can move per
// second by each of the means a collective has, alone and with the other core doing the same.
//
//   memcpy     user-space copy of S bytes (glibc: non-temporal stores past its threshold)
//   readv      process_vm_readv of S bytes out of another process, in PIECE-byte pieces
//              (what hetobs's and Open MPI's single copy cost)
//   fold       dst[i] += src[i] over S bytes of float32 (the reduction, vectorised as hetobs's)
//
// "x2" runs the same on both cores at once (two processes, each its own buffers, started
// together), which is where a two-rank all_reduce lives: both ranks copy at the same time.
// Rates are bytes moved (S per call) per second, best of REPS timed batches. Buffers are on
// transparent huge pages where the kernel gives them (madvise), as numpy's and the bench's are:
// without, process_vm_readv of 64 MiB ran at about half the speed here (4.4 against 8 GB/s).
//
//   cc -O3 -march=native -o /tmp/shm_floor bench/shm_floor.c && /tmp/shm_floor 1M 16M 64M
//
// The arithmetic it feeds is in docs/PERF.md "Toward the limit".
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { REPS = 5, PIECE = 1 << 20 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* alloc(size_t n) {
  void* p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  madvise(p, n, MADV_HUGEPAGE);
  memset(p, 1, n);  // fault every page in before timing
  return p;
}

static void fold(float* restrict d, const float* restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

// One measurement in this process: iterations sized to ~50 ms, best of REPS.
static double measure(const char* what, size_t S, pid_t peer, void* peer_buf) {
  char* a = alloc(S);
  char* b = alloc(S);
  int iters = (int)(1 + (256u << 20) / S);
  double best = 1e30;
  for (int rep = 0; rep < REPS; ++rep) {
    double t0 = now();
    for (int it = 0; it < iters; ++it) {
      if (!strcmp(what, "memcpy")) {
        memcpy(b, a, S);
      } else if (!strcmp(what, "fold")) {
        fold((float*)b, (const float*)a, S / 4);
      } else {
        for (size_t off = 0; off < S; off += PIECE) {
          size_t len = S - off < PIECE ? S - off : PIECE;
          struct iovec l = {b + off, len}, r = {(char*)peer_buf + off, len};
          if (process_vm_readv(peer, &l, 1, &r, 1, 0) != (ssize_t)len) { perror("process_vm_readv"); exit(1); }
        }
      }
    }
    double dt = (now() - t0) / iters;
    if (dt < best) best = dt;
  }
  munmap(a, S);
  munmap(b, S);
  return S / best / 1e9;
}

// A child that holds a buffer of S bytes of its own (not pages shared with us since the fork,
// as a peer rank's are not) for readers until it is told to go.
static pid_t holder(size_t S, void** buf, int* stop_fd) {
  int stop[2], addr[2];
  if (pipe(stop) || pipe(addr)) { perror("pipe"); exit(1); }
  pid_t c = fork();
  if (c == 0) {
    close(stop[1]);
    void* mine = alloc(S);
    (void)!write(addr[1], &mine, sizeof mine);
    char x;
    (void)!read(stop[0], &x, 1);
    _exit(0);
  }
  close(stop[0]);
  (void)!read(addr[0], buf, sizeof *buf);
  close(addr[0]);
  close(addr[1]);
  *stop_fd = stop[1];
  return c;
}

static double run(const char* what, size_t S, int pair) {
  // Each worker reports its rate through a pipe; x2 starts two at once and sums.
  int n = pair ? 2 : 1, fds[2][2];
  pid_t w[2];
  for (int i = 0; i < n; ++i) {
    if (pipe(fds[i])) { perror("pipe"); exit(1); }
    w[i] = fork();
    if (w[i] == 0) {
      void* buf = 0;
      int stop = -1;
      pid_t h = strcmp(what, "readv") ? 0 : holder(S, &buf, &stop);
      double r = measure(what, S, h, buf);
      if (h) { close(stop); waitpid(h, 0, 0); }
      (void)!write(fds[i][1], &r, sizeof r);
      _exit(0);
    }
  }
  double total = 0;
  for (int i = 0; i < n; ++i) {
    double r = 0;
    (void)!read(fds[i][0], &r, sizeof r);
    waitpid(w[i], 0, 0);
    total += r;
  }
  return total / n;  // per core
}

static size_t parse(const char* s) {
  char* end;
  double v = strtod(s, &end);
  if (*end == 'K') v *= 1 << 10;
  if (*end == 'M') v *= 1 << 20;
  if (*end == 'G') v *= 1 << 30;
  return (size_t)v;
}

int main(int argc, char** argv) {
  printf("| size | memcpy | memcpy x2 | readv | readv x2 | fold | fold x2 |\n|---|---|---|---|---|---|---|\n");
  for (int i = 1; i < argc; ++i) {
    size_t S = parse(argv[i]);
    printf("| %s |", argv[i]);
    const char* what[] = {"memcpy", "readv", "fold"};
    for (int k = 0; k < 3; ++k)
      for (int pair = 0; pair < 2; ++pair) printf(" %.2f |", run(what[k], S, pair));
    printf("\n");
    fflush(stdout);
  }
  printf("GB/s per core (bytes of S per call); x2: both cores at once, per core\n");
  return 0;
}
