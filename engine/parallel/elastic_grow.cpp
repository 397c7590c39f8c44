// Elastic growth of a ParallelTrainer (issue #17; the rule is in parallel_trainer.hpp): joiners admitted at step
// boundaries, and the state adoption it shares with the survivors' re-form after a loss.
#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/parallel/parallel_trainer.hpp"

namespace tandem::engine::parallel {

void ParallelTrainer::adopt_state(int root) {
  Snapshot s = snapshot_;  // received into a copy: a failure half-way leaves this rank's own snapshot whole
  int64_t progress[11] = {s.steps, s.completed_epochs, static_cast<int64_t>(s.sampler.seed), s.sampler.epoch,
                          s.sampler.position, s.sampler_world};
  for (size_t k = 0; k < 4; ++k) progress[6 + k] = static_cast<int64_t>(s.rng[k]);
  progress[10] = s.taken;
  world_->broadcast(progress, 11, DType::kI64, root)->wait();
  const auto floats = [&](std::vector<float>& v) {
    if (!v.empty()) world_->broadcast(v.data(), v.size(), DType::kF32, root)->wait();
  };
  floats(s.params);
  floats(s.buffers);
  for (std::vector<float>& v : s.state) floats(v);
  s.steps = progress[0];
  s.completed_epochs = progress[1];
  s.sampler = {static_cast<uint64_t>(progress[2]), progress[3], progress[4]};
  s.sampler_world = static_cast<int>(progress[5]);
  s.taken = progress[10];
  for (size_t k = 0; k < 4; ++k) s.rng[k] = static_cast<uint64_t>(progress[6 + k]);
  snapshot_ = std::move(s);
  restore_snapshot(true);
  if (pc_.strategy == Strategy::kDdp) lr_scale_ = static_cast<double>(grid_.dp) / initial_dp_;
}

bool ParallelTrainer::grows() const noexcept {
  return pc_.elastic && pc_.strategy == Strategy::kDdp && grid_.pp == 1 && absorbing_ && dp_comm_ != nullptr &&
         !ps_ && !sync_;
}

bool ParallelTrainer::grows_grid() const noexcept {
  return reforms_grid() && absorbing_ && own_comm_ != nullptr && !spare_;
}

void ParallelTrainer::maybe_admit() {
  if (grows_grid()) {
    if (optimizer_->steps() % pc_.join_poll_steps != 0) return;
    // Admit whole rows until no wider grid can be made (the ranks admitted here poll once more with everyone at their
    // first step; bounded: every pass admits at least one rank or returns).
    for (;;) {
      const int k = to_draft(own_comm_->size(), own_comm_->pending_joins());
      if (k <= 0 || !admit_grid(k)) return;
    }
  }
  if (!grows() || optimizer_->steps() % pc_.join_poll_steps != 0) return;
  // Admit until nobody waits: the ranks admitted here poll once more with everyone at their first step (bounded:
  // every pass admits at least one rank or returns).
  while (dp_comm_->pending_joins() > 0)
    if (!admit()) return;
}

bool ParallelTrainer::admit() {
  const auto t0 = std::chrono::steady_clock::now();
  comm::GrowOptions o;
  o.max_ranks = pc_.max_ranks;
  std::unique_ptr<comm::Communicator> grown = dp_comm_->grow(o);
  if (!grown) return false;
  const int before = grid_.world;
  take_snapshot();
  executor_->set_reducer(nullptr);
  reducer_.reset();
  retired_.push_back(std::move(dp_comm_));
  if (grown_) retired_.push_back(std::move(grown_));
  grown_ = std::move(grown);
  world_ = grown_.get();
  grid_.world = grid_.dp = world_->size();
  grid_.rank = grid_.dp_rank = world_->rank();
  config_.world = grid_.dp;
  config_.rank = grid_.dp_rank;
  // The joiners' constructor, mirrored collective by collective: the settings, the data-parallel group, the
  // replicated state, the barrier; then both sides take rank 0's state.
  agree_on_settings(true);
  dp_comm_ = world_->split(0, grid_.dp_rank);
  world_ = dp_comm_.get();
  broadcast_replica_state();
  world_->barrier()->wait();
  share_grown_state();
  reducer_ = std::make_unique<GradientReducer>(*dp_comm_, model_, job_.pipeline.stage_plans[0].buckets,
                                               pc_.compression, tracer_);
  executor_->set_reducer(reducer_.get());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  last_admission_ms_ = ms;
  log::warn("elastic: {} rank(s) joined at step {}; {} ranks go on (world ranks {}) after {:.0f} ms: learning rate x "
            "{:.4g}, epoch {} continues at sample {} of the new shards (seen by world rank {})",
            grid_.world - before, optimizer_->steps(), grid_.world, fmt::join(members_, ", "), ms, lr_scale_,
            sampler_.epoch(), sampler_.position(), world_rank());
  return true;
}

bool ParallelTrainer::admit_grid(int k) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!snapshot_valid_) take_snapshot();  // a second admission at this boundary: the state of the grid now
  comm::GrowOptions o;
  o.max_ranks = pc_.max_ranks;
  o.limit = k;
  std::unique_ptr<comm::Communicator> grown = own_comm_->grow(o);
  if (!grown) return false;
  const int before = grid_.world, dp_before = grid_.dp;
  executor_->set_reducer(nullptr);
  reducer_.reset();
  enter_grown(std::move(grown), nullptr);
  attach_reducer();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  last_admission_ms_ = ms;
  log::warn("elastic: {} rank(s) admitted at step {}; the grid widened from {} to {} x {} (dp x pp) over world ranks "
            "{} after {:.0f} ms: learning rate x {:.4g}, epoch {} continues at sample {} of the new shards (seen by "
            "world rank {}; {} grid ranks before)",
            k, optimizer_->steps(), dp_before, grid_.dp, grid_.pp, fmt::join(members_, ", "), ms, lr_scale_,
            sampler_.epoch(), sampler_.position(), world_rank(), before);
  return true;
}

void ParallelTrainer::enter_grown(std::unique_ptr<comm::Communicator> grown, comm::Communicator* borrowed) {
  comm::Communicator& g = grown ? *grown : *borrowed;
  std::unique_ptr<comm::Communicator> own = g.split(0, g.rank());
  if (grown) {
    if (grown_) retired_.push_back(std::move(grown_));
    grown_ = std::move(grown);
  }
  if (own_comm_) retired_.push_back(std::move(own_comm_));
  own_comm_ = std::move(own);
  world_ = own_comm_.get();
  form_grid("admission", false);
}

void ParallelTrainer::attach_reducer() {
  if (!executor_) return;  // a spare
  if (!ps_ && dp_comm_ && dp_comm_->size() > 1) {
    reducer_ = std::make_unique<GradientReducer>(*dp_comm_, model_,
                                                 job_.pipeline.stage_plans[static_cast<size_t>(grid_.stage)].buckets,
                                                 pc_.compression, tracer_);
  }
  executor_->set_reducer(ps_ ? static_cast<GradientSync*>(ps_.get()) : rounds_ ? nullptr : reducer_.get());
}

bool ParallelTrainer::wait_as_spare() {
  if (released_) return false;
  while (spare_) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<comm::Communicator> grown;
    try {
      grown = spare_via_->rejoin(std::chrono::milliseconds(pc_.spare_wait_ms));
    } catch (const Error& e) {
      // Refused: the job ended (its rank 0 refuses whoever still waits) or it is full (max_ranks).
      if (e.status() != Status::kUnsupported || std::string(e.what()).find("refused") == std::string::npos) throw;
      released_ = true;
      completed_epochs_ = std::max<int64_t>(completed_epochs_, config_.epochs);
      log::info("elastic: spare world rank {} leaves: {}", spare_label_, e.what());
      return false;
    }
    enter_grown(std::move(grown), nullptr);
    attach_reducer();
    if (!spare_)
      log::warn("elastic: spare world rank {} drafted into the grid {} x {} (dp x pp) after {:.0f} ms of waiting, at "
                "step {}",
                world_rank(), grid_.dp, grid_.pp,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                optimizer_->steps());
  }
  return true;
}

void ParallelTrainer::share_grown_state() {
  // Who is who (world ranks: joiners take numbers after every rank the job ever had), the job's starting width
  // (the learning-rate rule), the epoch length its schedule was laid out with and its elastic settings.
  int64_t head[7] = {initial_dp_, initial_world_, schedule_epoch_steps_, 0, pc_.min_ranks, pc_.max_ranks,
                     pc_.join_poll_steps};
  std::vector<int64_t> labels(static_cast<size_t>(grid_.world), -1);
  if (grid_.rank == 0) {
    int next = initial_world_;
    for (int r : members_) next = std::max(next, r + 1);
    for (int r : lost_) next = std::max(next, r + 1);
    for (size_t i = 0; i < labels.size(); ++i)
      labels[i] = i < members_.size() ? members_[i] : next++;
    head[3] = next;
  }
  world_->broadcast(head, 7, DType::kI64, 0)->wait();
  world_->broadcast(labels.data(), labels.size(), DType::kI64, 0)->wait();
  initial_dp_ = static_cast<int>(head[0]);
  initial_world_ = static_cast<int>(head[1]);
  // The job's elastic bounds and polling cadence hold for the joiners too (a joiner polling at another cadence
  // would call a collective the others do not).
  pc_.min_ranks = static_cast<int>(head[4]);
  pc_.max_ranks = static_cast<int>(head[5]);
  pc_.join_poll_steps = static_cast<int>(head[6]);
  if (schedule_epoch_steps_ != head[2]) {
    schedule_epoch_steps_ = head[2];
    schedule_ = optim::parse_schedule(config_.schedule, config_.optimizer.lr, schedule_epoch_steps_, config_.epochs);
  }
  members_.assign(labels.begin(), labels.end());
  if (pc_.joining) take_snapshot();  // a joiner's own state only sizes what it receives
  adopt_state(0);
}

}  // namespace tandem::engine::parallel
