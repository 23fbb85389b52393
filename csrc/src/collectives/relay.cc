// relay: a pure transfer of many messages to and from peers in one op (the cross-island
// path of a heterogeneous job). First every pair of ends checks that they agree on what
// crosses their link (one 64-byte header each way), then the bytes move: pipelined
// through staging slots (relay/pipeline.h), or unpipelined (copy all, send all, copy
// all: the baseline the benchmark compares with). Stage kNone skips the copies.
#include <algorithm>
#include <vector>

#include "hetobs/collectives/algorithm.h"
#include "hetobs/common/clock.h"
#include "hetobs/relay/pipeline.h"
#include "hetobs/relay/relay_state.h"

namespace hetobs {
namespace {

constexpr uint32_t kHeaderMagic = 0x31594c52;  // "RLY1"
constexpr uint64_t kFnvOffset = 1469598103934665603ULL, kFnvPrime = 1099511628211ULL;

// What one end says about its link to the other: what it sends there, what it expects
// from there, and how it cuts messages for the wire (0: whole messages).
struct LinkHeader {
  uint32_t magic = kHeaderMagic;
  uint32_t version = 1;
  uint64_t wire_chunk = 0;
  uint64_t n_send = 0, send_bytes = 0, send_hash = kFnvOffset;
  uint64_t n_recv = 0, recv_bytes = 0, recv_hash = kFnvOffset;
};
static_assert(sizeof(LinkHeader) == 64, "relay link header is 64 bytes");

void addMessage(uint64_t* n, uint64_t* bytes, uint64_t* hash, size_t len) {
  ++*n;
  *bytes += len;
  for (int i = 0; i < 8; ++i) *hash = (*hash ^ ((uint64_t(len) >> (8 * i)) & 0xff)) * kFnvPrime;
}

std::string messages(uint64_t n, uint64_t bytes) {
  return strFormat("%llu message%s (%llu bytes)", (unsigned long long)n, n == 1 ? "" : "s", (unsigned long long)bytes);
}

std::string cutting(uint64_t chunk) {
  return chunk ? strFormat("%llu-byte chunks (pipeline=True)", (unsigned long long)chunk)
               : std::string("whole messages (pipeline=False)");
}

// Peers of this relay, in order of first appearance.
std::vector<int> peersOf(const RelayRequest& r) {
  std::vector<int> peers;
  for (const auto* list : {&r.sends, &r.recvs})
    for (const RelayMessage& m : *list)
      if (std::find(peers.begin(), peers.end(), m.peer) == peers.end()) peers.push_back(m.peer);
  return peers;
}

void checkLinks(Communicator& c, const RelayRequest& r, const std::vector<int>& peers) {
  std::vector<LinkHeader> mine(peers.size()), theirs(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    LinkHeader& h = mine[i];
    h.wire_chunk = r.pipeline ? r.chunk_bytes : 0;
    for (const RelayMessage& m : r.sends)
      if (m.peer == peers[i]) addMessage(&h.n_send, &h.send_bytes, &h.send_hash, m.bytes);
    for (const RelayMessage& m : r.recvs)
      if (m.peer == peers[i]) addMessage(&h.n_recv, &h.recv_bytes, &h.recv_hash, m.bytes);
  }
  std::vector<SendItem> s(peers.size());
  std::vector<RecvItem> q(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    s[i].peer = q[i].peer = peers[i];
    s[i].data = reinterpret_cast<const uint8_t*>(&mine[i]);
    q[i].dst = reinterpret_cast<uint8_t*>(&theirs[i]);
    s[i].len = q[i].len = sizeof(LinkHeader);
  }
  c.exchange(s.data(), s.size(), q.data(), q.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    const LinkHeader &m = mine[i], &t = theirs[i];
    std::string who = c.describePeer(peers[i]);
    if (t.magic != kHeaderMagic || t.version != 1)
      throw RelayMismatch(strFormat("relay with %s: its link header is not a relay header (magic 0x%08x)", who.c_str(),
                                    t.magic));
    if (t.n_send != m.n_recv || t.send_bytes != m.recv_bytes || t.send_hash != m.recv_hash)
      throw RelayMismatch(strFormat("relay with %s: it sends %s%s to this rank, this rank expects %s from it",
                                    who.c_str(), messages(t.n_send, t.send_bytes).c_str(),
                                    t.n_send == m.n_recv && t.send_bytes == m.recv_bytes ? " of other sizes" : "",
                                    messages(m.n_recv, m.recv_bytes).c_str()));
    if (t.n_recv != m.n_send || t.recv_bytes != m.send_bytes || t.recv_hash != m.send_hash)
      throw RelayMismatch(strFormat("relay with %s: it expects %s from this rank, this rank sends %s%s to it",
                                    who.c_str(), messages(t.n_recv, t.recv_bytes).c_str(),
                                    messages(m.n_send, m.send_bytes).c_str(),
                                    t.n_recv == m.n_send && t.recv_bytes == m.send_bytes ? " of other sizes" : ""));
    if (t.wire_chunk != m.wire_chunk)
      throw RelayMismatch(strFormat("relay with %s: it cuts messages into %s, this rank into %s", who.c_str(),
                                    cutting(t.wire_chunk).c_str(), cutting(m.wire_chunk).c_str()));
  }
}

// Wait for a lane's copy, still honouring the op's deadline and the watchdog.
void waitLane(Communicator& c, CopyLane& lane, uint64_t ticket) {
  while (lane.completed() < ticket) {
    c.checkDeadline();
    lane.waitFor(ticket, 20000000);
  }
}

size_t piecesOf(size_t bytes, size_t chunk) { return bytes ? (bytes + chunk - 1) / chunk : 1; }

// Count `msgs` in chunk-sized pieces into one stage counter of each peer.
void countPieces(std::vector<RelayPeerCounters>& pc, const std::vector<RelayMessage>& msgs, size_t chunk,
                 std::atomic<uint64_t> RelayPeerCounters::*stage) {
  for (const RelayMessage& m : msgs)
    (pc[size_t(m.peer)].*stage).fetch_add(piecesOf(m.bytes, chunk), std::memory_order_relaxed);
}

// Copy all, send all, copy all.
void relayUnpipelined(Communicator& c, RelayRequest& r, RelayState& st, StagedPath* path) {
  auto& pc = st.peers();
  size_t sendTotal = 0, recvTotal = 0;
  for (const RelayMessage& m : r.sends) sendTotal += m.bytes;
  for (const RelayMessage& m : r.recvs) recvTotal += m.bytes;
  countPieces(pc, r.sends, r.chunk_bytes, &RelayPeerCounters::send_chunks);
  countPieces(pc, r.recvs, r.chunk_bytes, &RelayPeerCounters::recv_chunks);
  uint8_t* sb = path && !r.sends.empty() ? path->send_bulk.ensure(*path->in, std::max<size_t>(sendTotal, 1))
                                         : nullptr;
  uint8_t* rb = path && !r.recvs.empty() ? path->recv_bulk.ensure(*path->out, std::max<size_t>(recvTotal, 1))
                                         : nullptr;
  // Copy in, in chunk-sized pieces (the same per-copy cost the pipeline pays).
  if (path) {
    size_t off = 0;
    uint64_t last = 0;
    for (const RelayMessage& m : r.sends) {
      for (size_t o = 0; o < m.bytes; o += r.chunk_bytes)
        last = path->in->post(sb + off + o, m.data + o, std::min(r.chunk_bytes, m.bytes - o));
      off += m.bytes;
    }
    waitLane(c, *path->in, last);
    countPieces(pc, r.sends, r.chunk_bytes, &RelayPeerCounters::copied_in);
  }
  // Send all: whole messages.
  std::vector<SendItem> s(r.sends.size());
  std::vector<RecvItem> q(r.recvs.size());
  size_t off = 0;
  for (size_t i = 0; i < r.sends.size(); ++i) {
    s[i].peer = r.sends[i].peer;
    s[i].data = path ? sb + off : r.sends[i].data;
    s[i].len = r.sends[i].bytes;
    off += r.sends[i].bytes;
  }
  off = 0;
  for (size_t i = 0; i < r.recvs.size(); ++i) {
    q[i].peer = r.recvs[i].peer;
    q[i].dst = path ? rb + off : r.recvs[i].data;
    q[i].len = r.recvs[i].bytes;
    off += r.recvs[i].bytes;
  }
  int64_t w0 = monoNs();
  c.exchange(s.data(), s.size(), q.data(), q.size());
  r.phases.wire_ns = monoNs() - w0;
  countPieces(pc, r.sends, r.chunk_bytes, &RelayPeerCounters::sent);
  countPieces(pc, r.recvs, r.chunk_bytes, &RelayPeerCounters::received);
  // Copy out.
  if (path) {
    off = 0;
    uint64_t last = 0;
    for (const RelayMessage& m : r.recvs) {
      for (size_t o = 0; o < m.bytes; o += r.chunk_bytes)
        last = path->out->post(m.data + o, rb + off + o, std::min(r.chunk_bytes, m.bytes - o));
      off += m.bytes;
    }
    waitLane(c, *path->out, last);
    countPieces(pc, r.recvs, r.chunk_bytes, &RelayPeerCounters::copied_out);
  }
}

uint64_t chunksOf(const RelayRequest& r) {
  uint64_t n = 0;
  for (const auto* list : {&r.sends, &r.recvs})
    for (const RelayMessage& m : *list) n += piecesOf(m.bytes, r.chunk_bytes);
  return n;
}

}  // namespace

void relay(Communicator& c, const OpArgs& a) {
  RelayRequest& r = *a.relay;
  int64_t t0 = monoNs();
  r.phases = RelayPhases{};
  for (const RelayMessage& m : r.sends) r.phases.bytes_sent += m.bytes;
  for (const RelayMessage& m : r.recvs) r.phases.bytes_recv += m.bytes;
  RelayState& st = c.relayState();
  for (auto& p : st.peers()) p.reset();
  st.stage.store(uint8_t(r.stage), std::memory_order_relaxed);
  st.pipeline.store(r.pipeline, std::memory_order_relaxed);
  st.chunk_bytes.store(r.chunk_bytes, std::memory_order_relaxed);
  st.slots.store(r.slots, std::memory_order_relaxed);
  st.device_type.store(r.device_type, std::memory_order_relaxed);
  st.device_index.store(r.device, std::memory_order_relaxed);
  checkLinks(c, r, peersOf(r));
  StagedPath* path = r.stage == RelayStage::kNone ? nullptr : &st.path(r);
  // Sources are written, and destinations may still be read, on the caller's stream.
  void* callerStream = r.stage == RelayStage::kCuda   ? r.cuda_stream
                       : r.stage == RelayStage::kDevice && r.order_after_stream
                           ? reinterpret_cast<void*>(intptr_t(r.device_stream))
                           : nullptr;
  if (path && (callerStream || (r.stage == RelayStage::kDevice && r.order_after_stream))) {
    path->in->orderAfter(callerStream);
    path->out->orderAfter(callerStream);
  }
  int64_t in0 = path ? path->in->busyNs() : 0, out0 = path ? path->out->busyNs() : 0;
  try {
    if (r.pipeline) {
      RelayPipeline p(r, st, path);
      c.exchangeFed(p);
      r.phases.wire_ns = p.wireNs();
    } else {
      relayUnpipelined(c, r, st, path);
    }
  } catch (...) {
    if (path) drainAfterFailure(*path);
    throw;
  }
  if (path) {
    r.phases.d2h_ns = path->in->busyNs() - in0;
    r.phases.h2d_ns = path->out->busyNs() - out0;
  }
  r.phases.chunks = chunksOf(r);
  r.phases.wall_ns = monoNs() - t0;
}

}  // namespace hetobs
