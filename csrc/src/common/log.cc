#include "hetobs/common/log.h"

#include <unistd.h>

#include <atomic>
#include <mutex>

#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"

namespace hetobs {
namespace {
std::atomic<int> gLevel{int(LogLevel::kWarn)};
std::mutex gPrefixMu;
std::string gPrefix;
const char* kNames[] = {"ERROR", "WARN", "INFO", "DEBUG"};
}  // namespace

void setLogLevel(LogLevel level) { gLevel.store(int(level)); }
LogLevel logLevel() { return LogLevel(gLevel.load(std::memory_order_relaxed)); }

void setLogPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> g(gPrefixMu);
  gPrefix = prefix;
}

void logLine(LogLevel level, const std::string& msg) {
  std::string prefix;
  {
    std::lock_guard<std::mutex> g(gPrefixMu);
    prefix = gPrefix;
  }
  std::string line = "hetobs " + std::string(kNames[int(level)]) + " [pid " + std::to_string(getpid()) +
                     (prefix.empty() ? "" : " " + prefix) + "] " + msg + "\n";
  ssize_t rc = ::write(2, line.data(), line.size());
  (void)rc;
}

int64_t monoToWallNs(int64_t mono) {
  static const int64_t offset = wallNs() - monoNs();
  return mono + offset;
}

}  // namespace hetobs
