#pragma once
// This process's presence in a job: its settings, its listener, and every rank's card.
// Communicators (the world and those split from it) share it.
#include <memory>
#include <string>
#include <vector>

#include "hetobs/bootstrap/card.h"
#include "hetobs/bootstrap/handshake.h"
#include "hetobs/bootstrap/listener.h"
#include "hetobs/comm/config.h"

namespace hetobs {

class Communicator;

class Endpoint : public std::enable_shared_from_this<Endpoint> {
 public:
  explicit Endpoint(CommConfig cfg);
  ~Endpoint();

  const CommConfig& config() const { return cfg_; }
  const std::string& jobId() const { return cfg_.job_id; }
  // Take the job id the ranks agreed on (rank 0's, from the rendezvous or the store) and
  // start this rank's runtime (job directory, stats segment, watchdog) under it. Before
  // this, a rank whose id was generated has no presence in any job. With an id that was
  // set (HETOBS_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID), a different one is an Error.
  // Idempotent for the same id.
  void adoptJobId(const std::string& id);
  const Credentials& credentials() const { return cred_; }
  const Card& card() const { return card_; }
  const std::vector<Card>& cards() const { return cards_; }
  Listener& listener() { return *listener_; }

  // Advertise the local address the kernel uses toward `host` (the rendezvous host) in this
  // rank's card, for cards exchanged elsewhere (a store): rendezvous() does it itself.
  void advertiseToward(const std::string& host);
  // Exchange cards through rank 0 at master (start-up only), then connect the world.
  std::shared_ptr<Communicator> rendezvous(const std::string& masterAddr, int masterPort);
  // Connect the world from cards gathered elsewhere (e.g. a store handed in by Python).
  // commId != 0: these cards are a sub-group only (a torch.distributed group) whose members
  // are `worldRanks` in the job; the job's world and side channels are someone else's.
  std::shared_ptr<Communicator> connect(const std::vector<std::string>& encodedCards, uint64_t commId = 0,
                                        std::vector<int> worldRanks = {});

  int64_t connectDeadline() const;

 private:
  void startRuntime();

  CommConfig cfg_;
  bool started_ = false;  // the runtime runs under cfg_.job_id (adoptJobId or a set id)
  Credentials cred_;
  Card card_;
  std::vector<Card> cards_;
  std::unique_ptr<Listener> listener_;
};

// Try to authenticate to a rank's listener (a liveness/auth probe); throws AuthError if refused.
void probe(const std::string& host, int port, const std::string& job, const std::string& secret, double timeoutS);

}  // namespace hetobs
