// hetobs_native_tests [NAME...]: runs every test (or those named); exit 0 when all pass.
#include <cstdlib>
#include <cstring>
#include <exception>

#include "native_test.h"

namespace hetobs_test {

std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

namespace {
int failures = 0;
}

void fail(const char* file, int line, const std::string& what) {
  ++failures;
  std::fprintf(stderr, "  FAILED %s:%d: %s\n", file, line, what.c_str());
}

}  // namespace hetobs_test

int main(int argc, char** argv) {
  using namespace hetobs_test;
  int failed = 0, ran = 0;
  for (const Case& c : registry()) {
    bool wanted = argc < 2;
    for (int i = 1; i < argc; ++i) wanted |= std::strcmp(argv[i], c.name) == 0;
    if (!wanted) continue;
    ++ran;
    int before = failures;
    std::fprintf(stderr, "[ RUN  ] %s\n", c.name);
    try {
      c.fn();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("exception: ") + e.what());
    }
    bool ok = failures == before;
    failed += ok ? 0 : 1;
    std::fprintf(stderr, "[ %s ] %s\n", ok ? " OK " : "FAIL", c.name);
  }
  if (ran == 0) {
    std::fprintf(stderr, "no test matched\n");
    return 2;
  }
  std::fprintf(stderr, "%d of %d native tests failed\n", failed, ran);
  return failed ? 1 : 0;
}
