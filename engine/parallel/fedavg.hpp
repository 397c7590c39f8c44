#pragma once
// Federated averaging (McMahan et al. 2017) over the workers of a ParallelTrainer (issue #13, strategy fedavg).
//
// Clients: K = `clients` virtual clients (0: one per worker), each holding a fixed shard of the training set --
// IID or Dirichlet(dirichlet_alpha) label skew (engine/data/partition.hpp), seeded by the run's seed. A round:
//   1. sample_clients picks ceil(C K) of the K clients (C = client_fraction), seeded by (seed, round): the same
//      list on every rank; sampled client j runs on worker j % workers (clients_of_worker);
//   2. each worker trains each of its clients from the current global model for local_epochs over the client's
//      own data (a fresh optimizer per client and round) and sums n_k x_k over them (n_k: the client's samples;
//      x_k: its parameters and batch-norm buffers afterwards);
//   3. RoundExchange: worker 0 collects the others' sums with deadline-bounded receives, averages
//      sum_k n_k x_k / sum_k n_k over the updates that arrived by the deadline, and sends every worker the new
//      global model together with which updates were counted. One epoch of the trainer is one round.
//
// The deadline (round_deadline_s; 0: 0.9 x the communicator's timeout, so a round closes before the transport's
// own deadline would fail the job) runs from the round's start on worker 0. Its receives for a round are posted
// then; a worker whose update is not in by the deadline is dropped from the round -- logged with its rank and
// clients on worker 0, and on the worker itself when it learns the outcome -- and the round closes with whoever
// reported (never an unbounded wait). A late update still arrives later, into the receive posted for its round
// (messages of one tag arrive in order, and every update carries its round number), and is discarded there, so
// it can never be mistaken for the next round's. A worker later than the communicator's timeout counts as dead
// and fails the job with a timeout naming it.
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.hpp"

namespace tandem::engine::parallel {

// ceil(fraction x clients) distinct clients of [0, clients), ascending, from (seed, round).
std::vector<int32_t> sample_clients(int32_t clients, double fraction, uint64_t seed, int64_t round);
// The sampled clients worker `worker` trains: sampled[j] for j % workers == worker.
std::vector<int32_t> clients_of_worker(const std::vector<int32_t>& sampled, int worker, int workers);

// One worker's contribution to a round.
struct RoundReport {
  double samples = 0;     // sum of n_k over its clients: the weight of its update
  double loss_sum = 0;    // training figures of its local epochs (summed over samples)
  double correct = 0, scored = 0;
  int32_t clients = 0;
};

// How a round closed; the same on every worker.
struct RoundOutcome {
  int64_t round = 0;
  std::vector<int> dropped;  // workers whose update missed the deadline, ascending
  bool counted = true;       // this worker's update was counted
  RoundReport total;         // over the counted updates
};

class RoundExchange {
 public:
  // `workers`: their communicator (null: one worker); borrowed. deadline_s as in the header (0: the default).
  RoundExchange(comm::Communicator* workers, double deadline_s);
  ~RoundExchange();
  RoundExchange(const RoundExchange&) = delete;
  RoundExchange& operator=(const RoundExchange&) = delete;

  // Starts round `round` (worker 0: posts its receives; the deadline runs from here). `size`: values of a state.
  void begin(int64_t round, size_t size);
  // Ends the round: `sum` in: this worker's sum of n_k x_k; out: the new global state (unchanged `previous` when no
  // update was counted). Worker 0 waits for the others' updates until the deadline, then averages and replies.
  RoundOutcome finish(std::vector<float>& sum, const RoundReport& mine, const std::vector<float>& previous);
  double deadline_s() const noexcept { return deadline_s_; }
  // After worker(s) died (ParallelTrainer's recovery): rounds go on over `workers`, the survivors' communicator.
  // The round in flight is abandoned (the trainer redoes it from the survivors' agreed global model, the sampled
  // clients re-dealt over the survivors). Returns the old communicator's buffers still in flight; they must outlive
  // that communicator.
  std::shared_ptr<void> rebind(comm::Communicator* workers);

 private:
  struct Incoming {  // worker 0: one worker's update for one round
    int worker = 0;
    int64_t round = 0;
    std::vector<double> header;
    std::vector<float> body;
    std::unique_ptr<comm::Work> header_work, body_work;
    bool done() const;
  };
  struct Outgoing {  // worker 0: a reply in flight (its buffers outlive the send)
    std::shared_ptr<std::vector<double>> header;
    std::shared_ptr<std::vector<float>> body;
    std::unique_ptr<comm::Work> header_work, body_work;
  };
  void reap_late();
  void reap_sent();

  comm::Communicator* workers_;
  double deadline_s_;
  int64_t round_ = -1;
  size_t size_ = 0;
  std::chrono::steady_clock::time_point started_{};
  std::vector<std::unique_ptr<Incoming>> incoming_;  // this round's, by worker (index 0 unused)
  std::deque<std::unique_ptr<Incoming>> late_;       // dropped updates still to arrive
  std::deque<Outgoing> sent_;
};

}  // namespace tandem::engine::parallel
