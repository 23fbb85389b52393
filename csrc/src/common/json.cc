#include "hetobs/common/json.h"

#include <cmath>
#include <cstdio>

namespace hetobs {

std::string jsonEscape(const std::string& s) {
  std::string o;
  o.reserve(s.size() + 2);
  o += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += char(c);  // UTF-8 passes through; invalid bytes are the reader's to reject
        }
    }
  }
  o += '"';
  return o;
}

void JsonWriter::sep() {
  if (afterKey_) {
    afterKey_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::beginObject() {
  sep();
  out_ += '{';
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::endObject() {
  out_ += '}';
  first_.pop_back();
  return *this;
}
JsonWriter& JsonWriter::beginArray() {
  sep();
  out_ += '[';
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::endArray() {
  out_ += ']';
  first_.pop_back();
  return *this;
}
JsonWriter& JsonWriter::key(const char* k) {
  sep();
  out_ += jsonEscape(k);
  out_ += ':';
  afterKey_ = true;
  return *this;
}
JsonWriter& JsonWriter::value(const std::string& s) {
  sep();
  out_ += jsonEscape(s);
  return *this;
}
JsonWriter& JsonWriter::value(const char* s) { return s ? value(std::string(s)) : null(); }
JsonWriter& JsonWriter::value(int64_t v) {
  sep();
  out_ += std::to_string(v);
  return *this;
}
JsonWriter& JsonWriter::value(uint64_t v) {
  sep();
  out_ += std::to_string(v);
  return *this;
}
JsonWriter& JsonWriter::value(double v) {
  sep();
  if (!std::isfinite(v)) {
    out_ += "null";
  } else {
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", v);
    out_ += buf;
  }
  return *this;
}
JsonWriter& JsonWriter::value(bool v) {
  sep();
  out_ += v ? "true" : "false";
  return *this;
}
JsonWriter& JsonWriter::null() {
  sep();
  out_ += "null";
  return *this;
}
JsonWriter& JsonWriter::raw(const std::string& json) {
  sep();
  out_ += json;
  return *this;
}

}  // namespace hetobs
