// One spread per incident. When a rank hangs, every rank waiting on it sees the hang at
// about the same moment; each starting its own spread (as each did before) multiplies
// the requests by the number of watchdogs that fire before the first spread reaches them
// (38 at 1,024 ranks on a loaded machine). Instead a rank whose watchdog fires asks a
// coordinator, world rank 0, to start the incident's spread, and writes its own dump when
// that spread reaches it (with its own cause and reason "watchdog", and the spread's
// asker and times). Rank 0 starts one spread per incident however many ask it.
//
// Fallbacks, so that a dead or stopped coordinator costs time, not the dumps: no answer
// from rank 0 within the side-channel timeout, ask rank 1, then rank 2; a rank that is
// itself the next coordinator, or that none answered, starts the spread itself (the old
// behaviour). A coordinator that answered but whose spread does not reach this rank
// within kJoinWaitNs is given up on the same way.
#include "hetobs/common/clock.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/observe/runtime.h"

namespace hetobs {
namespace {
constexpr int kCoordinators = 3;            // world ranks 0, 1, 2, in that order
constexpr double kStartAskTimeoutS = 1.0;   // as a spread's request to one chunk head
// Depth log4(N) hops plus one side-channel timeout per dead head on the path, with room.
constexpr int64_t kJoinWaitNs = 5000000000LL;
}  // namespace

bool Runtime::askToStartSpread(int coordinator, const DumpRequest& req) {
  Card c;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (coordinator < 0 || size_t(coordinator) >= world_.size()) return false;
    c = world_[size_t(coordinator)];
  }
  // "start\n<incident>\n<reason>\n<from>\n<asked_ns>\n<cause>" (runtime.cc, handleControl)
  std::string request = strFormat("start\n%s\npeer_request\n%d\n%lld\n", req.incident.c_str(), cfg_.rank,
                                  (long long)wallNs()) +
                        req.cause;
  try {
    std::string reply = sideChannelRequest(c.ip, c.port, cfg_.job, cfg_.secret, request, kStartAskTimeoutS);
    return reply.compare(0, 2, "ok") == 0;
  } catch (const std::exception& e) {
    HETOBS_DEBUG("incident %s: coordinator rank %d did not take the start request: %s", req.incident.c_str(),
                 coordinator, e.what());
    return false;
  }
}

void Runtime::joinOrStartSpread(DumpRequest req) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    // Reached already: dump() finds the incident handed on or written and starts nothing.
    if (dumped_.count(req.incident) || spreadOrigin_.count(req.incident)) {
      lk.unlock();
      dump(req);
      return;
    }
    for (const DumpRequest& q : queue_)
      if (q.incident == req.incident && q.ask_peers) {  // a spread: our next turn dumps it, with our cause
        joins_[req.incident] = PendingJoin{req, monoNs() + kJoinWaitNs};
        return;
      }
  }
  for (int c = 0; c < kCoordinators && c < cfg_.world_size; ++c) {
    if (c == cfg_.rank) break;  // the next coordinator is this rank: start it here
    // Registered, with this ask in it, before asking: the spread may reach us before the
    // coordinator answers, and the dump it makes must still say whom this rank asked.
    req.start_asks.asked.push_back(c);
    {
      std::lock_guard<std::mutex> g(mu_);
      joins_[req.incident] = PendingJoin{req, monoNs() + kJoinWaitNs};
    }
    bool ok = askToStartSpread(c, req);
    std::lock_guard<std::mutex> g(mu_);
    (ok ? req.start_asks.answered : req.start_asks.unanswered).push_back(c);
    auto it = joins_.find(req.incident);
    if (it == joins_.end()) return;  // the spread reached us meanwhile and took the join
    it->second.req.start_asks = req.start_asks;
    if (ok) return;  // the coordinator's spread will reach us
    joins_.erase(it);
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    joins_.erase(req.incident);
  }
  dump(req);  // origin -1 and ask_peers: this rank heads the whole world (dump.cc)
}

void Runtime::takeJoin(DumpRequest* req) {
  // Only a spread answers the join: a one-rank request (hetobs dump --job) of the same id
  // meanwhile does not, or the spread this rank waits for might never be started.
  if (!req->ask_peers) return;
  std::lock_guard<std::mutex> g(mu_);
  auto it = joins_.find(req->incident);
  if (it == joins_.end()) return;
  const DumpRequest& own = it->second.req;
  if (req->reason == "peer_request") {  // this rank saw the hang itself: say what it saw
    req->reason = own.reason;
    req->cause = own.cause;
    req->cause_info = own.cause_info;
  }
  req->hang_detected_ns = own.hang_detected_ns;
  req->suspect = own.suspect;
  req->start_asks = own.start_asks;
  // The last ask may still be in flight; a spread started by that coordinator is its answer.
  PeerAnswers& asks = req->start_asks;
  bool pending = asks.asked.size() > asks.answered.size() + asks.unanswered.size();
  if (pending && asks.asked.back() == req->origin) asks.answered.push_back(req->origin);
  joins_.erase(it);
}

void Runtime::startOverdueJoins() {
  std::vector<DumpRequest> overdue;
  {
    std::lock_guard<std::mutex> g(mu_);
    int64_t now = monoNs();
    for (auto it = joins_.begin(); it != joins_.end();) {
      if (now < it->second.deadline_mono_ns) {
        ++it;
        continue;
      }
      overdue.push_back(it->second.req);
      it = joins_.erase(it);
    }
  }
  for (DumpRequest& req : overdue) {
    HETOBS_WARN("incident %s: no dump request reached this rank within %.0f s of its watchdog; spreading it from here",
                req.incident.c_str(), double(kJoinWaitNs) / 1e9);
    dump(req);
  }
}

}  // namespace hetobs
