#pragma once
// What a rank does when the result digests of an op differ (collectives/digest.h): log the
// verdict, write its dump of the one incident every rank of the op writes alike
// (`data-mismatch-c<comm>-s<seq>`, reason and cause_info kind `data_mismatch`), and return
// the sentence for the error the job is told. One path for the native communicator and for
// a wrapped vendor backend's ExternalComm.
#include <string>
#include <vector>

#include "hetobs/collectives/digest.h"
#include "hetobs/common/wire.h"

namespace hetobs {

struct MismatchSite {
  uint64_t comm_id = 0;
  const std::vector<int>* world = nullptr;  // the communicator's world ranks, by comm rank
  int rank = 0;                             // this rank in the communicator
  OpKind op = OpKind::kAllReduce;
  uint64_t seq = 0;
  std::string what;  // the op as people read it ("all_reduce seq 12 ...")
};

// *worldRanksOut: the world ranks the verdict names (every differing rank; all of them when
// there is no majority).
std::string reportDataMismatch(const DigestVerdict& v, const MismatchSite& site, std::vector<int>* worldRanksOut);

}  // namespace hetobs
