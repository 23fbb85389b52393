#pragma once
// Minimal leveled logging to stderr (HETOBS_DEBUG). The core never prints
// otherwise; a log line is one write() so lines from ranks do not interleave.
#include <string>

#include "hetobs/common/error.h"

namespace hetobs {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void setLogLevel(LogLevel level);
LogLevel logLevel();
void logLine(LogLevel level, const std::string& msg);
void setLogPrefix(const std::string& prefix);  // e.g. "rank 3"

}  // namespace hetobs

#define HETOBS_LOG(level, ...)                                               \
  do {                                                                       \
    if (int(::hetobs::LogLevel::level) <= int(::hetobs::logLevel()))         \
      ::hetobs::logLine(::hetobs::LogLevel::level, ::hetobs::strFormat(__VA_ARGS__)); \
  } while (0)
#define HETOBS_WARN(...) HETOBS_LOG(kWarn, __VA_ARGS__)
#define HETOBS_INFO(...) HETOBS_LOG(kInfo, __VA_ARGS__)
#define HETOBS_DEBUG(...) HETOBS_LOG(kDebug, __VA_ARGS__)
