#include "hetobs/comm/endpoint.h"

#include <unistd.h>

#include <atomic>

#include "hetobs/bootstrap/rendezvous.h"
#include "hetobs/comm/communicator.h"
#include "hetobs/common/clock.h"
#include "hetobs/common/env_config.h"
#include "hetobs/common/error.h"
#include "hetobs/common/log.h"
#include "hetobs/common/net.h"
#include "hetobs/observe/runtime.h"
#include "hetobs/record/recorder.h"

namespace hetobs {

TransportChoice parseTransport(const std::string& s) {
  if (s == "auto" || s.empty()) return TransportChoice::kAuto;
  if (s == "shm") return TransportChoice::kShm;
  if (s == "tcp") return TransportChoice::kTcp;
  throw Error("HETOBS_TRANSPORT='" + s + "': expected auto, shm or tcp");
}

Endpoint::Endpoint(CommConfig cfg) : cfg_(std::move(cfg)) {
  if (cfg_.size < 1 || cfg_.rank < 0 || cfg_.rank >= cfg_.size)
    throw Error(strFormat("rank %d is outside a world of %d ranks", cfg_.rank, cfg_.size));
  if (cfg_.job_id.empty()) throw Error("a job id is required (HETOBS_JOB_ID)");
  cred_.job = cfg_.job_id;
  cred_.key = cfg_.secret.empty() ? cfg_.job_id : cfg_.secret;
  // Once per job, not once per rank: rank 0 speaks for all (the others would repeat it N times).
  if (cfg_.secret.empty() && cfg_.size > 1 && cfg_.rank == 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      HETOBS_WARN("HETOBS_SECRET is not set: connections are checked against the job id but not authenticated");
  }
  setLogPrefix("rank " + std::to_string(cfg_.rank));
  listener_ = std::make_unique<Listener>(cred_, cfg_.size > 1 ? listenAddressFromEnv() : std::string("127.0.0.1"),
                                         size_t(cfg_.size - 1));
  if (!cfg_.job_id_generated) startRuntime();
  card_.rank = cfg_.rank;
  card_.pid = int(getpid());
  card_.host_key = localHostKey();
  card_.hostname = localHostname();
  // Bound to one address (HETOBS_SOCKET_IFNAME, MASTER_ADDR's route): that is the only one to dial.
  card_.ip = listener_->host() != "0.0.0.0" ? listener_->host() : "127.0.0.1";
  card_.port = listener_->port();
}

Endpoint::~Endpoint() = default;

void Endpoint::startRuntime() {
  if (started_) return;
  started_ = true;
  RuntimeConfig rc = cfg_.observe;
  rc.job = cfg_.job_id;
  rc.secret = cfg_.secret;
  rc.rank = cfg_.rank;
  rc.world_size = cfg_.size;
  Runtime* runtime = cfg_.watchdog ? &Runtime::init(rc) : nullptr;
  if (!runtime) Recorder::instance().configure(cfg_.observe.records);
  if (runtime)
    listener_->setControlHandler([runtime](const std::string& req) { return runtime->handleControl(req); });
}

void Endpoint::adoptJobId(const std::string& id) {
  if (id == cfg_.job_id) {
    if (cfg_.rank == 0 && cfg_.job_id_generated && !started_ && cfg_.size > 1)
      HETOBS_WARN("job id %s (generated: set HETOBS_JOB_ID to name the job); job directory %s/%s; "
                  "`hetobs jobs` lists the jobs", id.c_str(), cfg_.observe.dir.c_str(), id.c_str());
    startRuntime();
    return;
  }
  if (!cfg_.job_id_generated || started_)
    throw Error(strFormat("rank 0 is in job '%s' but this rank is in job '%s' (set the same HETOBS_JOB_ID on "
                          "every rank, or none)", id.c_str(), cfg_.job_id.c_str()));
  if (!validJobId(id)) throw Error(strFormat("rank 0 sent an unusable job id (%zu bytes)", id.size()));
  cfg_.job_id = id;
  cred_.job = id;
  cred_.key = cfg_.secret.empty() ? id : cfg_.secret;
  listener_->setCredentials(cred_);
  startRuntime();
}

int64_t Endpoint::connectDeadline() const { return deadlineAfter(monoNs(), cfg_.connect_timeout_s); }

void Endpoint::advertiseToward(const std::string& host) {
  // A listener bound to one address is reachable only there; the wildcard by the route toward `host`.
  if (cfg_.size > 1)
    card_.ip = listener_->host() != "0.0.0.0" ? listener_->host() : localAddressToward(SockAddr{host, 9});
}

std::shared_ptr<Communicator> Endpoint::rendezvous(const std::string& masterAddr, int masterPort) {
  SockAddr master{masterAddr, masterPort};
  advertiseToward(masterAddr);
  // Before the id is agreed the ranks share no job key: the rendezvous is keyed by the secret,
  // else by its port (what every rank of this job, and no other job running now, was given).
  Credentials boot = cred_;
  if (cfg_.job_id_generated) {
    boot.job = strFormat("rendezvous:%d", masterPort);
    boot.key = cfg_.secret.empty() ? "hetobs-rendezvous|" + boot.job : cfg_.secret;
  }
  if (cfg_.rank == 0) adoptJobId(cfg_.job_id);
  auto cards = hetobs::rendezvous(cfg_.rank, cfg_.size, master, boot, cfg_.job_id,
                                  [this](const std::string& id) { adoptJobId(id); }, card_.encode(),
                                  connectDeadline());
  adoptJobId(cfg_.job_id);  // world of one: nobody to agree with
  return connect(cards);
}

std::shared_ptr<Communicator> Endpoint::connect(const std::vector<std::string>& encodedCards, uint64_t commId,
                                                std::vector<int> worldRanks) {
  if (int(encodedCards.size()) != cfg_.size)
    throw Error(strFormat("got %zu cards for a world of %d ranks", encodedCards.size(), cfg_.size));
  if (!started_) adoptJobId(cfg_.job_id);  // cards from elsewhere, no id handed out: keep our own
  cards_.clear();
  for (size_t r = 0; r < encodedCards.size(); ++r) {
    Card c = Card::decode(encodedCards[r]);
    if (c.rank != int(r)) throw Error(strFormat("card %zu claims rank %d (two ranks share a RANK?)", r, c.rank));
    cards_.push_back(c);
  }
  std::vector<int> world(size_t(cfg_.size));
  for (int r = 0; r < cfg_.size; ++r) world[size_t(r)] = r;
  if (!worldRanks.empty() && worldRanks.size() != cards_.size())
    throw Error(strFormat("%zu world ranks given for %zu members", worldRanks.size(), cards_.size()));
  if (commId == 0)
    if (Runtime* rt = Runtime::get()) rt->setWorld(cards_);
  auto comm = std::make_shared<Communicator>(shared_from_this(), commId, world, cfg_.rank);
  if (!worldRanks.empty()) comm->setWorldRanks(std::move(worldRanks));
  comm->connect();
  return comm;
}

void probe(const std::string& host, int port, const std::string& job, const std::string& secret, double timeoutS) {
  int64_t deadline = deadlineAfter(monoNs(), timeoutS);
  int fd = connectTcp(SockAddr{host, port}, deadline);
  Credentials cred{job, secret.empty() ? job : secret};
  Hello h;
  h.purpose = Purpose::kProbe;
  try {
    clientHandshake(fd, cred, h, deadline);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

}  // namespace hetobs
