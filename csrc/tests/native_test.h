#pragma once
// A minimal test registry for hetobs_native_tests: no framework to install, one binary
// that the sanitizers run. A check that fails prints where and why and fails the test.
#include <cstdio>
#include <string>
#include <vector>

namespace hetobs_test {

struct Case {
  const char* name;
  void (*fn)();
};
std::vector<Case>& registry();
struct Register {
  Register(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};
void fail(const char* file, int line, const std::string& what);

}  // namespace hetobs_test

#define NATIVE_TEST(name)                                              \
  static void name();                                                  \
  static ::hetobs_test::Register name##_registered(#name, &name);      \
  static void name()

#define CHECK(cond, ...)                                                                      \
  do {                                                                                        \
    if (!(cond)) ::hetobs_test::fail(__FILE__, __LINE__, std::string(#cond) + ": " + (__VA_ARGS__)); \
  } while (0)
