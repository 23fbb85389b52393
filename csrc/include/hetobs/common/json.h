#pragma once
// A small streaming JSON writer for dumps and metadata: no allocation per value
// beyond the output string, correct string escaping, finite numbers only. Strings
// are written as valid UTF-8 whatever they hold: error texts come from peers, the OS
// and truncated buffers, and one bad byte must not make a reader reject a whole dump.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hetobs {

class JsonWriter {
 public:
  JsonWriter& beginObject();
  JsonWriter& endObject();
  JsonWriter& beginArray();
  JsonWriter& endArray();
  JsonWriter& key(const char* k);
  JsonWriter& value(const std::string& s);
  JsonWriter& value(const char* s);
  JsonWriter& value(int64_t v);
  JsonWriter& value(uint64_t v);
  JsonWriter& value(int v) { return value(int64_t(v)); }
  JsonWriter& value(unsigned v) { return value(uint64_t(v)); }
  JsonWriter& value(double v);
  JsonWriter& value(bool v);
  JsonWriter& null();
  JsonWriter& raw(const std::string& json);  // an already-encoded value
  template <class T>
  JsonWriter& field(const char* k, const T& v) {
    key(k);
    return value(v);
  }
  JsonWriter& nullField(const char* k) {
    key(k);
    return null();
  }
  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void sep();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool afterKey_ = false;
};

// A JSON string literal of `s`; bytes that are not valid UTF-8 become \ufffd.
std::string jsonEscape(const std::string& s);

// `s` with every byte that is not part of valid UTF-8 replaced by U+FFFD, for text
// handed to Python (which rejects invalid UTF-8 outright, turning an error into another).
std::string utf8Valid(const std::string& s);

// The longest prefix of s[0, n) of at most `max` bytes that does not end inside a
// multi-byte UTF-8 character (for fixed-size text fields such as OpRecord::error).
// No allocation: safe where the caller may not allocate.
size_t utf8PrefixLen(const char* s, size_t n, size_t max);

}  // namespace hetobs
