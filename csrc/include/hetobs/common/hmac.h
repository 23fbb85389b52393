#pragma once
// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), self-contained so the core and the
// LD_PRELOAD libraries need no crypto library. Used only for handshakes.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hetobs {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t len);
Digest hmacSha256(const std::string& key, const void* msg, size_t len);
// Constant-time comparison: the time taken does not depend on where bytes differ.
bool constantTimeEqual(const uint8_t* a, const uint8_t* b, size_t len);
// Fill with bytes from the kernel's CSPRNG (getrandom).
void randomBytes(void* out, size_t len);

}  // namespace hetobs
