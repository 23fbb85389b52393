#include "hetobs/bootstrap/handshake.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/hmac.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"

namespace hetobs {
namespace {

constexpr uint32_t kHelloMagic = 0x48425448;  // "HTBH"
constexpr uint32_t kVersion = 1;

struct ServerHello {
  uint32_t magic;
  uint32_t version;
  uint8_t nonce[16];
};
struct ClientHello {
  uint32_t magic;
  uint32_t version;
  uint32_t purpose;
  int32_t from_rank;
  int32_t to_rank;
  uint32_t generation;  // 0: a link's first connection; n > 0: its n-th reconnect (was reserved, always 0)
  uint64_t comm_id;
  uint8_t nonce[16];
  uint8_t mac[32];
};
struct ServerAccept {
  uint32_t magic;
  uint32_t status;  // 0 accepted, 1 refused
  uint8_t mac[32];
};

Digest clientMac(const Credentials& c, const uint8_t* snonce, const ClientHello& h) {
  std::string m = "hetobs-client|" + c.job + "|";
  m.append(reinterpret_cast<const char*>(snonce), 16);
  m.append(reinterpret_cast<const char*>(h.nonce), 16);
  m.append(reinterpret_cast<const char*>(&h.purpose), 4);
  m.append(reinterpret_cast<const char*>(&h.from_rank), 4);
  m.append(reinterpret_cast<const char*>(&h.to_rank), 4);
  m.append(reinterpret_cast<const char*>(&h.comm_id), 8);
  // Authenticated only when set, so first connections keep the MAC they always had.
  if (h.generation != 0) m.append(reinterpret_cast<const char*>(&h.generation), 4);
  return hmacSha256(c.key, m.data(), m.size());
}

Digest serverMac(const Credentials& c, const uint8_t* snonce, const uint8_t* cnonce, uint32_t status) {
  std::string m = "hetobs-server|" + c.job + "|";
  m.append(reinterpret_cast<const char*>(cnonce), 16);
  m.append(reinterpret_cast<const char*>(snonce), 16);
  // An accept keeps the MAC it always had; "closed" is bound to its own MAC, so an accept
  // cannot be replayed as a close or the other way round.
  if (status == kHandshakeCommClosed) m += "|closed";
  return hmacSha256(c.key, m.data(), m.size());
}

}  // namespace

void clientHandshake(int fd, const Credentials& cred, const Hello& hello, int64_t deadlineNs) {
  deadlineNs = std::min(deadlineNs, monoNs() + kHandshakeAnswerNs);  // silence past it: dropped
  // Until the server answers, an I/O failure (close, reset, our deadline) is a server that gave
  // up on us (its deadline, a full queue of unproven connections) or a network fault: dialling
  // again is right, which an AuthError would forbid. A refusal is an explicit answer (status 1).
  std::string server = peerAddressOf(fd);
  auto io = [&](auto&& step) {
    try {
      step();
    } catch (const Error& e) {
      throw HandshakeDropped(strFormat("%s dropped the connection before answering the handshake (%s)",
                                       server.c_str(), e.what()));
    }
  };
  ServerHello sh{};
  io([&] { readFull(fd, &sh, sizeof sh, deadlineNs, "handshake (server hello)"); });
  if (sh.magic != kHelloMagic || sh.version != kVersion)
    throw AuthError(strFormat("handshake with %s: not a hetobs peer or another protocol version", server.c_str()));
  ClientHello ch{};
  ch.magic = kHelloMagic;
  ch.version = kVersion;
  ch.purpose = uint32_t(hello.purpose);
  ch.from_rank = hello.from_rank;
  ch.to_rank = hello.to_rank;
  ch.comm_id = hello.comm_id;
  ch.generation = hello.generation;
  randomBytes(ch.nonce, sizeof ch.nonce);
  Digest mac = clientMac(cred, sh.nonce, ch);
  memcpy(ch.mac, mac.data(), 32);
  io([&] { writeFull(fd, &ch, sizeof ch, deadlineNs, "handshake (client hello)"); });
  ServerAccept sa{};
  io([&] { readFull(fd, &sa, sizeof sa, deadlineNs, "handshake (accept)"); });
  if (sa.magic != kHelloMagic || (sa.status != kHandshakeAccepted && sa.status != kHandshakeCommClosed))
    throw AuthError(strFormat("%s refused the handshake: wrong HETOBS_SECRET or another job (job id '%s')",
                              server.c_str(), cred.job.c_str()));
  Digest expect = serverMac(cred, sh.nonce, ch.nonce, sa.status);
  if (!constantTimeEqual(expect.data(), sa.mac, 32))
    throw AuthError(strFormat("%s could not prove it knows the job key; connection dropped", server.c_str()));
  if (sa.status == kHandshakeCommClosed)
    throw CommClosedError(strFormat("%s has closed communicator %llu", server.c_str(),
                                    (unsigned long long)hello.comm_id));
}

int dialAndShake(const ConnectTarget& target, const Credentials& cred, const Hello& hello, int64_t deadlineNs,
                 RetryLimits limits, const std::function<void(const std::string&)>& onDropped) {
  for (int attempt = 1;; ++attempt) {
    int fd = connectWithRetries(target, deadlineNs, limits);
    try {
      clientHandshake(fd, cred, hello, deadlineNs);
      return fd;
    } catch (const HandshakeDropped& e) {
      ::close(fd);
      if (onDropped) onDropped(e.what());
      int64_t wait = retryBackoffNs(attempt + 1);
      if (monoNs() + wait >= deadlineNs) throw;
      HETOBS_DEBUG("handshake with %s dropped (%s); dialling again", target.what.c_str(), e.what());
      usleep(useconds_t(wait / 1000));
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
}

Hello serverHandshake(int fd, const Credentials& cred, int64_t deadlineNs, const HandshakeProven& proven) {
  ServerHello sh{};
  sh.magic = kHelloMagic;
  sh.version = kVersion;
  randomBytes(sh.nonce, sizeof sh.nonce);
  writeFull(fd, &sh, sizeof sh, deadlineNs, "handshake (server hello)");
  ClientHello ch{};
  readFull(fd, &ch, sizeof ch, deadlineNs, "handshake (client hello)");
  ServerAccept sa{};
  sa.magic = kHelloMagic;
  Digest expect = clientMac(cred, sh.nonce, ch);
  bool ok = ch.magic == kHelloMagic && ch.version == kVersion && constantTimeEqual(expect.data(), ch.mac, 32);
  if (!ok) {
    sa.status = 1;
    try {
      writeFull(fd, &sa, sizeof sa, deadlineNs, "handshake (refusal)");
    } catch (const Error&) {
    }
    if (ch.magic != kHelloMagic) throw AuthError("not a hetobs handshake (bad magic)");
    if (ch.version != kVersion) throw AuthError(strFormat("handshake protocol version %u, expected %u", ch.version, kVersion));
    throw AuthError("bad HMAC: wrong HETOBS_SECRET or another job");
  }
  Hello h;
  h.purpose = Purpose(ch.purpose);
  h.comm_id = ch.comm_id;
  h.from_rank = ch.from_rank;
  h.to_rank = ch.to_rank;
  h.generation = ch.generation;
  // Proven before the answer goes out: once the client reads it, it acts on this connection,
  // so nothing may cut it from here on (a cut between the two broke 128-rank start-ups).
  sa.status = proven ? proven(h) : kHandshakeAccepted;
  Digest mac = serverMac(cred, sh.nonce, ch.nonce, sa.status);
  memcpy(sa.mac, mac.data(), 32);
  writeFull(fd, &sa, sizeof sa, deadlineNs, "handshake (accept)");
  return h;
}

}  // namespace hetobs
