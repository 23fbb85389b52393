#pragma once
// Authenticated connection handshake (mutual HMAC-SHA256 over fresh nonces).
// The key is HETOBS_SECRET when set, else the job id: without a secret a stranger
// who knows the job id can still connect (a warning says so), but two jobs never
// mix up their connections.
//
//   server -> client  ServerHello  {magic, version, server nonce}
//   client -> server  ClientHello  {magic, version, purpose, comm id, from, to, generation, client nonce,
//                                   HMAC(key, "client" | job | snonce | cnonce | fields)}
//   server -> client  ServerAccept {magic, status, HMAC(key, "server" | job | cnonce | snonce [| "closed"])}
//
// status 0 accepts, 1 refuses (bad MAC, another job), 2 says "that communicator is closed on
// this rank" to a redial or a reconnect probe: the deliberate close of a link whose connection
// broke before the peer's close message got through. Status 2 is MACed like an accept, so only a
// holder of the key can end someone's link that way. A connection the server drops before it
// answers (its handshake deadline, or a full queue of unauthenticated connections) is neither:
// the client may dial again (HandshakeDropped).
#include <cstdint>
#include <functional>
#include <string>

#include "hetobs/common/connect_retry.h"
#include "hetobs/common/error.h"

namespace hetobs {

enum class Purpose : uint32_t { kRendezvous = 1, kTransport = 2, kProbe = 3, kControl = 4 };

struct Hello {
  Purpose purpose = Purpose::kTransport;
  uint64_t comm_id = 0;
  int32_t from_rank = -1;
  int32_t to_rank = -1;
  uint32_t generation = 0;  // kTransport: 0 a link's first connection, n its n-th reconnect
};

// A client waits at most this long for the server's hello and answer (servers drop a
// handshake unanswered after 2 s): a connection made just before a network fault can go
// silent with no reset ever arriving (the server's packets met the fault), and waiting out the
// caller's whole deadline on it stalled reconnects and on-demand connects for 30-60 s. The
// exchange of resume notes on a re-made link waits as long at most, for the same reason.
constexpr int64_t kHandshakeAnswerNs = 5000000000LL;

constexpr uint32_t kHandshakeAccepted = 0;
constexpr uint32_t kHandshakeRefused = 1;
constexpr uint32_t kHandshakeCommClosed = 2;

// The server closed the connection before it accepted or refused: a busy or slow listener,
// never a verdict on us. Dialling again is right.
class HandshakeDropped : public Error {
 public:
  using Error::Error;
};
// The server proved it holds the key and said the communicator this connection is for is
// closed there (status 2).
class CommClosedError : public Error {
 public:
  using Error::Error;
};

struct Credentials {
  std::string job;
  std::string key;  // secret, or job id when no secret is set
};

// Throws AuthError if the server refuses us or cannot prove it knows the key, HandshakeDropped
// if it closed the connection without an answer, CommClosedError on status 2, Error (I/O).
void clientHandshake(int fd, const Credentials& cred, const Hello& hello, int64_t deadlineNs);
// Connect (connectWithRetries, `limits`) and shake hands; while the server drops the
// connection before it answers (HandshakeDropped) dial again, with back-off, until the
// deadline. Returns the connected fd (blocking); throws what the last try threw. `onDropped`
// hears each dropped try (the reconnect record keeps them).
int dialAndShake(const ConnectTarget& target, const Credentials& cred, const Hello& hello, int64_t deadlineNs,
                 RetryLimits limits = {}, const std::function<void(const std::string&)>& onDropped = {});
// Called once the client has proved it holds the key, before the server answers: the caller
// marks the connection proven (HandshakePool never cuts it after this) and chooses the status
// to send (kHandshakeAccepted or kHandshakeCommClosed).
using HandshakeProven = std::function<uint32_t(const Hello&)>;
// Returns what the client asked for; throws AuthError (bad MAC, wrong job) or Error (I/O).
// On AuthError the client has been told it was refused. When `proven` answered
// kHandshakeCommClosed the client has been told so and the Hello is returned all the same.
Hello serverHandshake(int fd, const Credentials& cred, int64_t deadlineNs, const HandshakeProven& proven = {});

}  // namespace hetobs
