#include "hetobs/common/json.h"

#include <cmath>
#include <cstdio>

namespace hetobs {

namespace {

// Length of the valid UTF-8 sequence starting at s[i] (RFC 3629: no overlong forms,
// no surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
size_t utf8SeqLen(const unsigned char* s, size_t n, size_t i) {
  unsigned char c = s[i];
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if ((s[i + k] & 0xC0) != 0x80) return 0;
  return len;
}

}  // namespace

std::string jsonEscape(const std::string& s) {
  std::string o;
  o.reserve(s.size() + 2);
  o += '"';
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = b[i];
    if (c >= 0x80) {
      size_t len = utf8SeqLen(b, n, i);
      if (len == 0) {
        o += "\\ufffd";  // not UTF-8 (or cut mid-character): one replacement per bad byte
        ++i;
      } else {
        o.append(s, i, len);
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += char(c);
        }
    }
    ++i;
  }
  o += '"';
  return o;
}

std::string utf8Valid(const std::string& s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  std::string o;
  o.reserve(n);
  for (size_t i = 0; i < n;) {
    size_t len = b[i] < 0x80 ? 1 : utf8SeqLen(b, n, i);
    if (len == 0) {
      o += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    } else {
      o.append(s, i, len);
      i += len;
    }
  }
  return o;
}

size_t utf8PrefixLen(const char* s, size_t n, size_t max) {
  if (n <= max) return n;
  size_t len = max;
  // Back off over continuation bytes to the start of the character that would be cut.
  while (len > 0 && (static_cast<unsigned char>(s[len]) & 0xC0) == 0x80) --len;
  return len;
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
