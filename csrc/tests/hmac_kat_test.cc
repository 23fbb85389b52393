// Known answers: SHA-256 (FIPS 180-2 appendix B / NIST examples) and HMAC-SHA256 (RFC 4231
// test cases 1-7; case 5 compares the first 128 bits, as the RFC specifies).
#include <string>

#include "hetobs/common/hmac.h"
#include "native_test.h"

namespace {

std::string hex(const hetobs::Digest& d, size_t bytes = 32) {
  static const char* k = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    out += k[d[i] >> 4];
    out += k[d[i] & 15];
  }
  return out;
}

std::string sha(const std::string& m) { return hex(hetobs::sha256(m.data(), m.size())); }
std::string mac(const std::string& key, const std::string& m, size_t bytes = 32) {
  return hex(hetobs::hmacSha256(key, m.data(), m.size()), bytes);
}

}  // namespace

NATIVE_TEST(sha256_fips180_vectors) {
  CHECK(sha("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", sha(""));
  CHECK(sha("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", sha("abc"));
  std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // 448 bits: padding spills a block
  CHECK(sha(two) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", sha(two));
  std::string million(1000000, 'a');
  CHECK(sha(million) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", sha(million));
}

NATIVE_TEST(hmac_sha256_rfc4231) {
  struct Kat {
    std::string key, data, expect;
  };
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += char(i);
  const Kat kats[] = {
      {std::string(20, '\x0b'), "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, std::string(50, '\xcd'), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(20, '\x0c'), "Test With Truncation", "a3b6167473100ee06e0c796c2955552b"},  // truncated to 128 bits
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
       "hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  int n = 1;
  for (const Kat& k : kats) {
    std::string got = mac(k.key, k.data, k.expect.size() / 2);
    CHECK(got == k.expect, "RFC 4231 test case " + std::to_string(n) + ": got " + got);
    ++n;
  }
}
