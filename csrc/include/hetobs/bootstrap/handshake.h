#pragma once
// Authenticated connection handshake (mutual HMAC-SHA256 over fresh nonces).
// The key is HETOBS_SECRET when set, else the job id: without a secret a stranger
// who knows the job id can still connect (a warning says so), but two jobs never
// mix up their connections.
//
//   server -> client  ServerHello  {magic, version, server nonce}
//   client -> server  ClientHello  {magic, version, purpose, comm id, from, to, generation, client nonce,
//                                   HMAC(key, "client" | job | snonce | cnonce | fields)}
//   server -> client  ServerAccept {magic, status, HMAC(key, "server" | job | cnonce | snonce)}
#include <cstdint>
#include <string>

namespace hetobs {

enum class Purpose : uint32_t { kRendezvous = 1, kTransport = 2, kProbe = 3, kControl = 4 };

struct Hello {
  Purpose purpose = Purpose::kTransport;
  uint64_t comm_id = 0;
  int32_t from_rank = -1;
  int32_t to_rank = -1;
  uint32_t generation = 0;  // kTransport: 0 a link's first connection, n its n-th reconnect
};

struct Credentials {
  std::string job;
  std::string key;  // secret, or job id when no secret is set
};

// Throws AuthError if the server refuses us or cannot prove it knows the key.
void clientHandshake(int fd, const Credentials& cred, const Hello& hello, int64_t deadlineNs);
// Returns what the client asked for; throws AuthError (bad MAC, wrong job) or Error (I/O).
// On AuthError the client has been told it was refused.
Hello serverHandshake(int fd, const Credentials& cred, int64_t deadlineNs);

}  // namespace hetobs
