#include "hetobs/comm/abort.h"

#include <sstream>
#include <vector>

namespace hetobs {
namespace {
constexpr char kSep = '\x1f';

std::string encodeDesc(const OpDesc& d) {
  std::ostringstream o;
  o << int(d.op) << ',' << int(d.dtype) << ',' << int(d.redop) << ',' << d.root << ',' << d.seq << ',' << d.count
    << ',' << d.comm_tag;
  return o.str();
}

bool decodeDesc(const std::string& s, OpDesc* d) {
  unsigned op, dt, ro;
  long long root;
  unsigned long long seq, count, tag;
  if (sscanf(s.c_str(), "%u,%u,%u,%lld,%llu,%llu,%llu", &op, &dt, &ro, &root, &seq, &count, &tag) != 7) return false;
  if (op >= unsigned(OpKind::kCount) || dt >= unsigned(DType::kCount) || ro >= unsigned(RedOp::kCount)) return false;
  d->op = OpKind(op);
  d->dtype = DType(dt);
  d->redop = RedOp(ro);
  d->root = int32_t(root);
  d->seq = seq;
  d->count = count;
  d->comm_tag = uint32_t(tag);
  return true;
}
}  // namespace

const char* abortKindName(AbortKind k) {
  switch (k) {
    case AbortKind::kPeer: return "peer_closed";
    case AbortKind::kMismatch: return "mismatch";
    case AbortKind::kTimeout: return "timeout";
    case AbortKind::kTransport: return "transport";
    case AbortKind::kOther: break;
  }
  return "other";
}

// v2 appends the origin to v1's fields; a v1 notice (an older peer) decodes with origin = reporter.
std::string AbortNotice::encode() const {
  std::ostringstream o;
  o << "hetobs-abort-v2" << kSep << int(kind) << kSep << reporter << kSep << encodeDesc(reporter_desc) << kSep
    << suspect << kSep << encodeDesc(suspect_desc) << kSep << origin << kSep << cause;
  return o.str();
}

AbortNotice AbortNotice::decode(const std::string& body) {
  AbortNotice n;
  std::vector<std::string> parts;
  size_t start = 0;
  size_t want = body.compare(0, 16, "hetobs-abort-v2" "\x1f") == 0 ? 7 : 6;
  for (size_t i = 0; i < want; ++i) {
    size_t pos = body.find(kSep, start);
    if (pos == std::string::npos) break;
    parts.push_back(body.substr(start, pos - start));
    start = pos + 1;
  }
  if (parts.size() != want || (want == 6 && parts[0] != "hetobs-abort-v1")) {
    n.cause = body;
    return n;
  }
  try {
    int kind = std::stoi(parts[1]);
    n.kind = kind >= 0 && kind <= int(AbortKind::kTransport) ? AbortKind(kind) : AbortKind::kOther;
    n.reporter = std::stoi(parts[2]);
    if (!decodeDesc(parts[3], &n.reporter_desc)) n.reporter = -1;
    n.suspect = std::stoi(parts[4]);
    if (!decodeDesc(parts[5], &n.suspect_desc)) n.suspect = -1;
    n.origin = want == 7 ? std::stoi(parts[6]) : n.reporter;
  } catch (const std::exception&) {
    n.reporter = n.suspect = n.origin = -1;
  }
  n.cause = body.substr(start);
  return n;
}

}  // namespace hetobs
