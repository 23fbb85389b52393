// The op-mismatch vote (comm/failure_state.h): no rank is the reference, the largest group
// wins only when strictly larger than the next, and the sentence names the deviants; and the
// wait policy's steps (comm/wait_policy.h): spin, yield, sleep, with the adaptive spin.
#include <map>
#include <string>

#include "hetobs/comm/failure_state.h"
#include "hetobs/comm/wait_policy.h"
#include "native_test.h"

using hetobs::MismatchVote;
using hetobs::OpDesc;
using hetobs::OpKind;
using hetobs::WaitPolicy;

namespace {

OpDesc op(OpKind k, uint64_t seq, uint64_t count) {
  OpDesc d;
  d.op = k;
  d.seq = seq;
  d.count = count;
  return d;
}

}  // namespace

NATIVE_TEST(mismatch_vote_names_the_minority_and_never_a_tie) {
  const OpDesc ar = op(OpKind::kAllReduce, 7, 1024), bc = op(OpKind::kBroadcast, 7, 1024);
  MismatchVote v = MismatchVote::tally({{0, ar}, {1, ar}, {2, bc}, {3, ar}});
  CHECK(v.majority(), "3 against 1 is a majority");
  CHECK(v.deviating() == std::vector<int>{2}, "rank 2 called the other op");
  std::string msg = v.describe(5, 0, "reported");
  CHECK(msg.find("deviating rank 2") != std::string::npos, msg);
  CHECK(msg.find("ranks 0, 1, 3 called") != std::string::npos, msg);

  MismatchVote tie = MismatchVote::tally({{0, ar}, {1, bc}});
  CHECK(!tie.majority(), "1 against 1 names nobody");
  CHECK(tie.describe(5, 1, "x").find("no majority among the 2 ranks heard") != std::string::npos,
        tie.describe(5, 1, "x"));

  MismatchVote same = MismatchVote::tally({{0, ar}, {1, ar}});
  CHECK(!same.majority() && same.groups.size() == 1, "one op heard: no deviant");
  CHECK(same.describe(5, 0, "what rank 1 said").find("every rank heard runs") != std::string::npos,
        same.describe(5, 0, "what rank 1 said"));
}

NATIVE_TEST(wait_policy_spins_then_yields_then_sleeps_and_adapts) {
  WaitPolicy w;
  using Step = WaitPolicy::Step;
  CHECK(w.next(0, true, false) == Step::kSpin, "a fresh wait over shm spins");
  CHECK(w.next(WaitPolicy::kSpinNs, true, false) == Step::kYield, "then yields");
  CHECK(w.next(WaitPolicy::kSpinNs + WaitPolicy::kYieldNs, true, false) == Step::kSleep, "then sleeps");
  CHECK(w.next(0, true, true) == Step::kYield, "oversubscribed: no spin");
  CHECK(w.next(WaitPolicy::kTcpSpinNs, false, false) == Step::kSleep, "all TCP: no yield after the short spin");
  CHECK(WaitPolicy::nextFed(0, true, false, true) == Step::kSleep, "copies in flight: sleep at once");
  for (int i = 0; i < 10; ++i) w.adapt(true, true);  // waits that spun out
  CHECK(w.next(WaitPolicy::kMinSpinNs, true, false) == Step::kYield, "the spin shrank to its floor");
  for (int i = 0; i < 10; ++i) w.adapt(true, false);  // waits that ended while spinning
  CHECK(w.next(WaitPolicy::kSpinNs - 1, true, false) == Step::kSpin, "and grew back");
  CHECK(WaitPolicy::idleSleepNs(0) == WaitPolicy::kSleepNs, "short waits sleep kSleepNs");
  CHECK(WaitPolicy::idleSleepNs(int64_t(1) << 40) == WaitPolicy::kLongSleepNs, "long ones at most kLongSleepNs");
}
