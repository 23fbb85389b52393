#include "hetobs/observe/exit_signal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace hetobs {
namespace {

struct Record {
  std::string path, tmp, head, mid, tail;
};

constexpr int kSignals[] = {SIGTERM, SIGHUP, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
std::atomic<Record*> gRecord{nullptr};
// Records replaced by newer ones are freed only 8 publications later: a handler that
// took one a moment before it was replaced can still be reading it.
constexpr size_t kRetired = 8;
Record* gRetired[kRetired] = {};
size_t gRetiredNext = 0;
std::mutex gPublishMu;
pid_t gPid = 0;

void writeAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += k;
    n -= size_t(k);
  }
}

void writeNumber(int fd, uint64_t v) {
  char rev[24];
  size_t n = 0;
  do {
    rev[n++] = char('0' + v % 10);
    v /= 10;
  } while (v != 0 && n < sizeof rev);
  char out[24];
  for (size_t i = 0; i < n; ++i) out[i] = rev[n - 1 - i];
  writeAll(fd, out, n);
}

void onFatalSignal(int sig, siginfo_t*, void*) {
  int saved = errno;
  Record* r = gRecord.exchange(nullptr);  // once: a second fatal signal meanwhile writes nothing
  if (r != nullptr && getpid() == gPid) {
    struct timespec ts {};
    clock_gettime(CLOCK_REALTIME, &ts);
    int fd = open(r->tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      writeAll(fd, r->head.data(), r->head.size());
      writeNumber(fd, uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec));
      writeAll(fd, r->mid.data(), r->mid.size());
      writeNumber(fd, uint64_t(sig));
      writeAll(fd, r->tail.data(), r->tail.size());
      close(fd);
      rename(r->tmp.c_str(), r->path.c_str());
    }
  }
  errno = saved;
  // The default action, as if this handler had never been there (it is only ever
  // installed over the default, so the process dies as it would have).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

}  // namespace

void installExitSignalRecorder() {
  std::lock_guard<std::mutex> g(gPublishMu);
  if (gPid != 0) return;
  gPid = getpid();
  for (int sig : kSignals) {
    struct sigaction cur {};
    if (sigaction(sig, nullptr, &cur) != 0) continue;
    // Only over the default action: a handler someone installed may not end the process
    // (HETOBS_DUMP_SIGNAL, Python's), and then the file would say it died when it did not.
    if ((cur.sa_flags & SA_SIGINFO) || cur.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_sigaction = onFatalSignal;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

void publishSignalRecord(const std::string& path, const std::string& head, const std::string& mid,
                         const std::string& tail) {
  auto* r = new Record{path, path + ".sig.tmp", head, mid, tail};
  std::lock_guard<std::mutex> g(gPublishMu);
  Record* old = gRecord.exchange(r);
  if (old != nullptr) {
    delete gRetired[gRetiredNext];
    gRetired[gRetiredNext] = old;
    gRetiredNext = (gRetiredNext + 1) % kRetired;
  }
}

void clearSignalRecord() {
  std::lock_guard<std::mutex> g(gPublishMu);
  Record* old = gRecord.exchange(nullptr);
  if (old != nullptr) {
    delete gRetired[gRetiredNext];
    gRetired[gRetiredNext] = old;
    gRetiredNext = (gRetiredNext + 1) % kRetired;
  }
}

}  // namespace hetobs
