#pragma once
// A small streaming JSON writer for dumps and metadata: no allocation per value
// beyond the output string, correct string escaping, finite numbers only.
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

std::string jsonEscape(const std::string& s);

}  // namespace hetobs
