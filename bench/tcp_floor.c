// The kernel's CPU cost of moving bytes over loopback TCP, with nothing else in the way: two
// processes exchange GIB GiB each way at once (as two neighbours of a ring do), non-blocking
// sockets, 512 KiB sends and receives, poll() when neither can move. Prints CPU seconds per
// GiB sent and received by one process (user + sys), and the wall rate.
//
// A collective over TCP moves b bytes out and b bytes in per rank (ring all_reduce: b =
// 2(n-1)/n x size), so CPU per op >= b / GiB x this figure for any send()/recv() transport:
// docs/PERF.md "s10" compares it with hetobs's and Gloo's CPU per op (bench/cpu_per_op.py).
//
//   cc -O2 -o /tmp/tcp_floor bench/tcp_floor.c && /tmp/tcp_floor [GIB] [SO_RCVLOWAT bytes]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kChunk = 512 * 1024 };

static double cpuSeconds(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

static double wallSeconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char* what) {
  perror(what);
  exit(1);
}

// Send and receive `total` bytes on `fd` at once; returns when both are done.
static void exchange(int fd, size_t total, int lowat, const char* who) {
  int one = 1, sndbuf = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  if (lowat > 1) setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  char* out = malloc(kChunk);
  char* in = malloc(kChunk);
  if (!out || !in) die("malloc");
  memset(out, 1, kChunk);
  size_t sent = 0, got = 0;
  double c0 = cpuSeconds(), t0 = wallSeconds();
  while (sent < total || got < total) {
    int moved = 0;
    if (sent < total) {
      size_t want = total - sent < kChunk ? total - sent : kChunk;
      ssize_t n = send(fd, out, want, MSG_NOSIGNAL);
      if (n > 0) sent += (size_t)n, moved = 1;
      else if (n < 0 && errno != EAGAIN) die("send");
    }
    if (got < total) {
      ssize_t n = recv(fd, in, kChunk, 0);
      if (n > 0) got += (size_t)n, moved = 1;
      else if (n == 0) die("peer closed early");
      else if (errno != EAGAIN) die("recv");
    }
    if (!moved) {
      struct pollfd p = {fd, (short)((got < total ? POLLIN : 0) | (sent < total ? POLLOUT : 0)), 0};
      poll(&p, 1, 1000);
    }
  }
  double cpu = cpuSeconds() - c0, wall = wallSeconds() - t0;
  double gib = (double)total / (1 << 30);
  printf("%s: %.3f s CPU per GiB sent and received, %.2f GB/s each way\n", who, cpu / gib, total / wall / 1e9);
  fflush(stdout);
}

int main(int argc, char** argv) {
  double gibs = argc > 1 ? atof(argv[1]) : 4;
  int lowat = argc > 2 ? atoi(argv[2]) : 0;
  size_t total = (size_t)(gibs * (1 << 30));
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr*)&a, sizeof a) || getsockname(ls, (struct sockaddr*)&a, &len) ||
      listen(ls, 1))
    die("listen");
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a)) die("connect");
    exchange(fd, total, lowat, "rank 1");
    _exit(0);
  }
  int fd = accept(ls, NULL, NULL);
  if (fd < 0) die("accept");
  exchange(fd, total, lowat, "rank 0");
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
