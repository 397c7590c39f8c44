#pragma once
// A communicator together with the rendezvous it was built on (rank 0's server among it): forwards
// every call to the communicator and keeps the rendezvous alive as long as the communicator or any
// split of it. Members are destroyed in reverse order: the communicator first, then the store it
// may still use while shutting down.
#include <memory>
#include <string>

#include "engine/comm/bootstrap.hpp"
#include "engine/comm/communicator.hpp"

namespace tandem::engine::comm {

class BootstrappedCommunicator final : public Communicator {
 public:
  BootstrappedCommunicator(Rendezvous rendezvous, std::unique_ptr<Communicator> inner)
      : rendezvous_(std::move(rendezvous)), inner_(std::move(inner)) {}

  const Rendezvous& rendezvous() const { return rendezvous_; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* transport_name() const override { return inner_->transport_name(); }
  const CommOptions& options() const override { return inner_->options(); }
  // The child shares this communicator's rendezvous (it may use the store after this one is gone).
  std::unique_ptr<Communicator> split(int color, int key) override;
  // Likewise for the survivors' communicator.
  std::unique_ptr<Communicator> shrink() override;
  void leave(const std::string& note) noexcept override { inner_->leave(note); }
  void set_note(const std::string& note) noexcept override { inner_->set_note(note); }
  std::vector<std::pair<int, std::string>> departures() const override { return inner_->departures(); }
  // The grown world shares it too (rank 0's server keeps serving the joiners).
  int64_t pending_joins() override { return inner_->pending_joins(); }
  int64_t peek_joins() override { return inner_->peek_joins(); }
  std::unique_ptr<Communicator> grow(const GrowOptions& options) override;
  std::unique_ptr<Communicator> rejoin(std::chrono::milliseconds wait) override;
  void refuse_joiners(const std::string& why) override { inner_->refuse_joiners(why); }
  int epoch() const override { return inner_->epoch(); }
  std::vector<int> parent_ranks() const override { return inner_->parent_ranks(); }
  std::unique_ptr<Work> allreduce(const void* s, void* r, size_t n, DType t, ReduceOp op) override {
    return inner_->allreduce(s, r, n, t, op);
  }
  std::unique_ptr<Work> reduce_scatter(const void* s, void* r, size_t n, DType t, ReduceOp op) override {
    return inner_->reduce_scatter(s, r, n, t, op);
  }
  std::unique_ptr<Work> allgather(const void* s, void* r, size_t n, DType t) override {
    return inner_->allgather(s, r, n, t);
  }
  std::unique_ptr<Work> broadcast(void* b, size_t n, DType t, int root) override {
    return inner_->broadcast(b, n, t, root);
  }
  std::unique_ptr<Work> reduce(const void* s, void* r, size_t n, DType t, ReduceOp op, int root) override {
    return inner_->reduce(s, r, n, t, op, root);
  }
  std::unique_ptr<Work> barrier() override { return inner_->barrier(); }
  std::unique_ptr<Work> send(const void* b, size_t n, DType t, int peer, uint32_t tag) override {
    return inner_->send(b, n, t, peer, tag);
  }
  std::unique_ptr<Work> recv(void* b, size_t n, DType t, int peer, uint32_t tag) override {
    return inner_->recv(b, n, t, peer, tag);
  }
  bool is_failed() const override { return inner_->is_failed(); }
  std::string failure_message() const override { return inner_->failure_message(); }
  FailureStatus failure_status() const override { return inner_->failure_status(); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  std::string stopped_by() const override { return inner_->stopped_by(); }
  Algorithm allreduce_algorithm_for(size_t count, DType dtype) const override {
    return inner_->allreduce_algorithm_for(count, dtype);
  }

 private:
  Rendezvous rendezvous_;
  std::unique_ptr<Communicator> inner_;
};

}  // namespace tandem::engine::comm
