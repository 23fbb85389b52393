#include "hetobs/observe/data_mismatch.h"

#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/observe/runtime.h"

namespace hetobs {

std::string reportDataMismatch(const DigestVerdict& v, const MismatchSite& site, std::vector<int>* worldRanksOut) {
  std::vector<int>& ranks = *worldRanksOut;
  const std::vector<int>& world = *site.world;
  std::string list;
  for (int r : v.differing) {
    ranks.push_back(world[size_t(r)]);
    list += (list.empty() ? "" : ", ") + std::to_string(ranks.back());
  }
  const int me = world[size_t(site.rank)];
  std::string where = v.element >= 0 ? strFormat("first differing element %lld", (long long)v.element)
                                     : std::string("differing element not found");
  std::string msg =
      v.majority
          ? strFormat("data mismatch in %s on comm %llu: the result of %s %s differs from the other ranks' (%s; "
                      "this rank: %d)", site.what.c_str(), (unsigned long long)site.comm_id,
                      ranks.size() > 1 ? "ranks" : "rank", list.c_str(), where.c_str(), me)
          : strFormat("data mismatch in %s on comm %llu: the ranks' results differ with no majority (ranks %s; %s; "
                      "this rank: %d)", site.what.c_str(), (unsigned long long)site.comm_id, list.c_str(),
                      where.c_str(), me);
  HETOBS_WARN("%s", msg.c_str());
  if (Runtime* rt = Runtime::get()) {
    // Every rank found the same difference at once: each writes its own dump of one incident.
    DumpRequest req;
    req.incident = strFormat("data-mismatch-c%llu-s%llu", (unsigned long long)site.comm_id,
                             (unsigned long long)site.seq);
    req.reason = "data_mismatch";
    req.cause = msg;
    req.cause_info.kind = "data_mismatch";
    if (v.majority) req.cause_info.culprits = ranks;
    req.cause_info.reporter = me;
    req.cause_info.op = opName(site.op);
    req.cause_info.seq = int64_t(site.seq);
    req.cause_info.comm = int64_t(site.comm_id & ((1ull << 53) - 1));
    req.cause_info.element = v.element;
    rt->dump(req);
  }
  return msg;
}

}  // namespace hetobs
