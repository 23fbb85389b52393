#include "hetobs/common/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

namespace hetobs {

std::string errnoString(int err) {
  char buf[128];
  return std::string(strerror_r(err, buf, sizeof buf));
}

std::string strFormat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::vector<char> buf(size_t(n > 0 ? n : 0) + 1);
  vsnprintf(buf.data(), buf.size(), fmt, ap2);
  va_end(ap2);
  return std::string(buf.data(), size_t(n > 0 ? n : 0));
}

}  // namespace hetobs
