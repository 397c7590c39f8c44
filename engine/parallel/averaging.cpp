#include "engine/parallel/averaging.hpp"

#include <algorithm>
#include <array>
#include <memory>
#include <numeric>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"

namespace tandem::engine::parallel {

namespace {

// Point-to-point tag of the gossip exchange on the workers' communicator (the trainer's own tags are below 100).
constexpr uint32_t kTagGossip = 201;
// The gossip receipt: a partner's word that this step's snapshot has reached it.
constexpr uint32_t kTagGossipReceipt = 202;

// The workers' mean state (collective); empty for one worker (its own state is the mean).
std::vector<float> workers_mean(comm::Communicator* workers, const ReplicaState& state) {
  if (workers == nullptr) return {};
  std::vector<float> x = state.get();
  allreduce_mean(*workers, x);
  return x;
}

class LocalSgd final : public StepSync {
 public:
  LocalSgd(comm::Communicator* workers, ReplicaState& state, int32_t period, int32_t warmup)
      : workers_(workers), state_(state), period_(period), warmup_(warmup) {}
  bool synchronous(int64_t step) const override { return step < warmup_ && step >= resume_at_; }
  void after_step(int64_t done) override {
    if (workers_ == nullptr || done <= resume_at_ || done <= warmup_ || (done - warmup_) % period_ != 0) return;
    std::vector<float> x = state_.get();
    allreduce_mean(*workers_, x);
    state_.set(x);
  }
  std::vector<float> consensus() override { return workers_mean(workers_, state_); }
  std::shared_ptr<void> rebind(comm::Communicator* workers, int64_t resume_at, int /*root*/) override {
    workers_ = workers != nullptr && workers->size() > 1 ? workers : nullptr;
    resume_at_ = resume_at;
    return nullptr;  // its exchanges are blocking: nothing in flight
  }

 private:
  comm::Communicator* workers_;
  ReplicaState& state_;
  int32_t period_, warmup_;
  int64_t resume_at_ = 0;
};

class Easgd final : public StepSync {
 public:
  Easgd(comm::Communicator* workers, ReplicaState& state, int32_t tau, double alpha)
      : workers_(workers), state_(state), tau_(tau), alpha_(static_cast<float>(alpha)), centre_(state.get()) {}
  void after_step(int64_t done) override {
    if (done % tau_ != 0 || done <= resume_at_) return;
    std::vector<float> x = state_.get();
    std::vector<float> d(x.size());
    for (size_t k = 0; k < x.size(); ++k) {
      d[k] = alpha_ * (x[k] - centre_[k]);
      x[k] -= d[k];
    }
    if (workers_ != nullptr) workers_->allreduce(d.data(), d.data(), d.size(), DType::kF32, ReduceOp::kSum)->wait();
    for (size_t k = 0; k < x.size(); ++k) centre_[k] += d[k];
    state_.set(x);
  }
  std::vector<float> consensus() override { return centre_; }
  void save(train::Checkpoint& ck) const override { ck.add("easgd.centre", centre_); }
  // A checkpoint of another strategy (or of asynchronous EASGD, whose centre lived on the servers) has no
  // easgd.centre record: its model is the centre (its model.params and model.buffers, which the trainer has just
  // loaded into this replica before its own state, if any).
  void load(const train::Checkpoint& ck, const std::string& path) override {
    std::vector<float> c;
    if (ck.has("easgd.centre")) {
      c = ck.tensor("easgd.centre");
    } else {
      c = ck.tensor("model.params");
      const std::vector<float>& b = ck.tensor("model.buffers");
      c.insert(c.end(), b.begin(), b.end());
    }
    TANDEM_CHECK(c.size() == centre_.size(), Status::kIo, "checkpoint '{}': the centre has {} values, the model {}",
                 path, c.size(), centre_.size());
    centre_ = std::move(c);
  }
  const std::vector<float>& centre() const noexcept { return centre_; }
  std::shared_ptr<void> rebind(comm::Communicator* workers, int64_t resume_at, int root) override {
    workers_ = workers != nullptr && workers->size() > 1 ? workers : nullptr;
    resume_at_ = resume_at;
    // The centre's copies may differ by the exchange the loss cut (completed on some survivors only): the
    // survivors adopt root's.
    if (workers_ != nullptr && !centre_.empty())
      workers_->broadcast(centre_.data(), centre_.size(), DType::kF32, root)->wait();
    return nullptr;
  }

 private:
  comm::Communicator* workers_;
  ReplicaState& state_;
  int32_t tau_;
  int64_t resume_at_ = 0;
  float alpha_;
  std::vector<float> centre_;  // replicated: every worker applies the same all-reduced sum
};

class Gossip final : public StepSync {
 public:
  Gossip(comm::Communicator* workers, ReplicaState& state, uint64_t seed)
      : workers_(workers), state_(state), seed_(seed) {}
  ~Gossip() override {
    // A step that failed half-way may leave the exchange in flight: its buffers must outlive it (bounded by the
    // communicator's deadline; a failed exchange is already reported by the step).
    try {
      if (send_) send_->wait();
      if (recv_) recv_->wait();
      if (receipt_out_) receipt_out_->wait();
      if (receipt_in_) receipt_in_->wait();
    } catch (...) {
    }
  }
  void before_step(int64_t step) override {
    partner_ = workers_ != nullptr && step >= resume_at_ ? gossip_partner(workers_->rank(), workers_->size(), seed_, step)
                                                         : -1;
    if (partner_ < 0) return;
    mine_ = state_.get();
    theirs_.assign(mine_.size(), 0.0f);
    recv_ = workers_->recv(theirs_.data(), theirs_.size(), DType::kF32, partner_, kTagGossip);
    if (!receipt_) receipt_ = std::make_shared<std::array<float, 2>>();
    receipt_in_ = workers_->recv(&(*receipt_)[1], 1, DType::kF32, partner_, kTagGossipReceipt);
    send_ = workers_->send(mine_.data(), mine_.size(), DType::kF32, partner_, kTagGossip);
  }
  void after_step(int64_t /*done*/) override {
    if (partner_ < 0) return;
    // The step ends once both snapshots have arrived (the step program's gossip: the simulator's as well). The
    // communicator's send is buffered -- done once copied -- so the arrival of ours is the partner's receipt:
    // without it the worker whose snapshot is still on the wire would start its next step, and its next
    // snapshot would queue behind the rest of this one on its uplink.
    send_->wait();
    recv_->wait();
    receipt_out_ = workers_->send(&(*receipt_)[0], 1, DType::kF32, partner_, kTagGossipReceipt);
    receipt_out_->wait();
    receipt_in_->wait();
    send_.reset();
    recv_.reset();
    receipt_out_.reset();
    receipt_in_.reset();
    std::vector<float> x = state_.get();
    for (size_t k = 0; k < x.size(); ++k) x[k] += 0.5f * (theirs_[k] - mine_[k]);
    state_.set(x);
    partner_ = -1;
  }
  std::vector<float> consensus() override { return workers_mean(workers_, state_); }
  std::shared_ptr<void> rebind(comm::Communicator* workers, int64_t resume_at, int /*root*/) override {
    // The matching is drawn over the survivors from now on: the lost rank is never a partner again.
    struct InFlight {
      std::vector<float> mine, theirs;
      std::unique_ptr<comm::Work> send, recv, receipt_out, receipt_in;
      std::shared_ptr<std::array<float, 2>> receipt;
    };
    auto old = std::make_shared<InFlight>(InFlight{std::move(mine_), std::move(theirs_), std::move(send_), std::move(recv_),
                                                   std::move(receipt_out_), std::move(receipt_in_), std::move(receipt_)});
    receipt_.reset();
    mine_.clear();
    theirs_.clear();
    partner_ = -1;
    workers_ = workers != nullptr && workers->size() > 1 ? workers : nullptr;
    resume_at_ = resume_at;
    return old;
  }

 private:
  comm::Communicator* workers_;
  ReplicaState& state_;
  int64_t resume_at_ = 0;
  uint64_t seed_;
  int partner_ = -1;
  std::vector<float> mine_, theirs_;
  std::unique_ptr<comm::Work> send_, recv_, receipt_out_, receipt_in_;
  // [0] sent, [1] received (the value carries nothing); on the heap, so that a rebind can hand it on in flight
  std::shared_ptr<std::array<float, 2>> receipt_;
};

}  // namespace

ReplicaState::ReplicaState(nn::Model& model, size_t first_layer, size_t end_layer)
    : model_(model), first_(first_layer), end_(end_layer) {
  params_ = model.param_offset(end_layer) - model.param_offset(first_layer);
  buffers_ = model.buffer_offset(end_layer) - model.buffer_offset(first_layer);
}

std::vector<float> ReplicaState::get() const {
  compute::Backend& be = model_.backend();
  std::vector<float> out(static_cast<size_t>(size()));
  if (params_ > 0) {
    const Tensor h = be.to_host(model_.range_params(first_, end_));
    std::copy_n(h.data<float>(), params_, out.begin());
  }
  if (buffers_ > 0) {
    const Tensor h = be.to_host(model_.range_buffers(first_, end_));
    std::copy_n(h.data<float>(), buffers_, out.begin() + params_);
  }
  return out;
}

void ReplicaState::set(const std::vector<float>& v) {
  TANDEM_CHECK(static_cast<int64_t>(v.size()) == size(), Status::kInternal, "replica state of {} values, {} given",
               size(), v.size());
  compute::Backend& be = model_.backend();
  if (params_ > 0) {
    Tensor dst = model_.range_params(first_, end_);
    be.copy(Tensor::wrap(const_cast<float*>(v.data()), dst.shape(), DType::kF32), dst);
  }
  if (buffers_ > 0) {
    Tensor dst = model_.range_buffers(first_, end_);
    be.copy(Tensor::wrap(const_cast<float*>(v.data()) + params_, dst.shape(), DType::kF32), dst);
  }
}

double easgd_alpha(double alpha, int workers) noexcept { return alpha > 0 ? alpha : 0.9 / std::max(workers, 1); }

int gossip_partner(int worker, int workers, uint64_t seed, int64_t step) {
  if (workers < 2) return -1;
  std::vector<int> perm(static_cast<size_t>(workers));
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng(mix64(mix64(seed, 0x676f73736970), static_cast<uint64_t>(step)));
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  const auto at = static_cast<size_t>(std::find(perm.begin(), perm.end(), worker) - perm.begin());
  const size_t mate = at ^ 1u;  // pairs (perm[0], perm[1]), (perm[2], perm[3]), ...
  return mate < perm.size() ? perm[mate] : -1;
}

void allreduce_mean(comm::Communicator& c, std::vector<float>& v) {
  if (v.empty()) return;
  c.allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum)->wait();
  const float inv = 1.0f / static_cast<float>(c.size());
  for (float& x : v) x *= inv;
}

std::unique_ptr<StepSync> make_averaging_sync(const CompiledJob& job, comm::Communicator* workers,
                                              ReplicaState& state, uint64_t seed) {
  const ParallelConfig& c = job.job.parallel;
  switch (job.sync.exchange) {
    case Exchange::kParamAverage:
      return std::make_unique<LocalSgd>(workers, state, job.sync.period, job.sync.warmup_steps);
    case Exchange::kElastic:
      if (c.easgd_async) return nullptr;  // the centre on a server: the parameter-server side
      return std::make_unique<Easgd>(workers, state, job.sync.period, easgd_alpha(c.alpha, job.sync.workers));
    case Exchange::kGossip: return std::make_unique<Gossip>(workers, state, seed);
    default: return nullptr;
  }
}

const std::vector<float>* easgd_centre(const StepSync* sync) noexcept {
  const auto* e = dynamic_cast<const Easgd*>(sync);
  return e != nullptr ? &e->centre() : nullptr;
}

}  // namespace tandem::engine::parallel
