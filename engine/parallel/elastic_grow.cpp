// Elastic growth of a ParallelTrainer (issue #17; the rule is in parallel_trainer.hpp): joiners admitted at step
// boundaries, and the state adoption it shares with the survivors' re-form after a loss.
#include <algorithm>
#include <array>
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
  // With parameter servers the workers' optimizer only counts steps (its state is on the servers): the count is the
  // job's. The rule of DDP grow: learning rate x dp' / dp where the servers average dp' gradients per update (ps,
  // ssp); ps-async applies one worker's gradient per update, whose batch does not change: x 1.
  if (!snapshot_.whole) optimizer_->restore(snapshot_.steps, optimizer_->state_tensors());
  if (pc_.strategy == Strategy::kDdp) lr_scale_ = static_cast<double>(grid_.dp) / initial_dp_;
  if (ps_ && !elastic_centre()) lr_scale_ = workers_lr_scale();
}

double ParallelTrainer::workers_lr_scale() const noexcept {
  return pc_.strategy == Strategy::kPsAsync ? 1.0 : static_cast<double>(grid_.dp) / initial_dp_;
}

bool ParallelTrainer::grows() const noexcept {
  return pc_.elastic && pc_.strategy == Strategy::kDdp && grid_.pp == 1 && absorbing_ && dp_comm_ != nullptr &&
         !ps_ && !sync_;
}

bool ParallelTrainer::grows_grid() const noexcept {
  return reforms_grid() && absorbing_ && own_comm_ != nullptr && !spare_;
}

bool ParallelTrainer::grows_workers() const noexcept {
  // A parameter-server job polls only when it was given a bound to grow to (max_ranks > 0; tandem launch --max-ranks
  // above -n sets it); a joiner is always one (pc_.joining). The compiled job says so (SyncProgram::join_check_every),
  // and the simulator charges the same checks.
  return pc_.elastic && ps_ != nullptr && !elastic_centre() && absorbing_ && own_comm_ != nullptr &&
         job_.sync.join_check_every > 0;
}

void ParallelTrainer::close_to_joiners() {
  if (world_ == nullptr || world_->rank() != 0 || pc_.joining || grows() || grows_grid() || grows_workers()) return;
  const char* name = strategy_name(pc_.strategy);
  std::string why;
  if (!pc_.elastic)
    why = fmt::format("the job is not elastic: {} without --elastic admits no joiners", name);
  else if (ps_ != nullptr && !elastic_centre())
    why = fmt::format("the job is full: {} ranks run and it admits no more ({} admits joiners only when launched "
                      "with --max-ranks above -n)",
                      world_->size(), name);
  else
    why = fmt::format("the job admits no joiners: elastic {}{} does not grow", name, grid_.pp > 1 ? " with pp > 1" : "");
  try {
    world_->refuse_joiners(why);
  } catch (const Error& e) {
    log::debug("elastic: could not close the job to joiners: {}", e.what());  // they wait, as before
  }
}

void ParallelTrainer::maybe_admit() {
  if (grows_workers()) {
    const int64_t steps = optimizer_->steps();
    const int64_t every = job_.sync.join_check_every;
    if (pc_.strategy != Strategy::kPsAsync) {
      // ps and ssp: the check rides on the push/pull messages (ParameterServerSync::request_admission). Worker 0
      // alone reads the store; every rank learns from the servers at which boundary to admit, and only there do
      // they all leave the region and admit.
      const int64_t due = ps_->admission_due();
      if (due >= 0 && steps >= due) {
        TANDEM_CHECK(steps == due, Status::kInternal,
                     "elastic: world rank {} is at step {}, past the admission due at step {}", world_rank(), steps, due);
        // One admission takes every joiner waiting (up to max_ranks); later ones are found by worker 0's next read.
        ps_->sync_point();  // a server may still release pull replies of step `due` here: they carry it too
        ps_->clear_admission();
        if (own_comm_->pending_joins() > 0) admit_workers();
        return;
      }
      if (due < 0 && grid_.rank == 0 && steps >= poll_from_ && steps % every == 0 &&
          own_comm_->peek_joins() > 0)
        ps_->request_admission();
      return;
    }
    if (steps < poll_from_ || steps % every != 0) return;
    // ps-async: no bound on how far a worker runs ahead, so no message is sure to carry a decision in time: the check
    // is collective over workers and servers, and every rank leaves the push/pull region first (a sync point), so
    // that no rank waits in it for another's push or pull. Admit until nobody waits (the ranks admitted here poll once
    // more with everyone).
    ps_->sync_point();
    while (own_comm_->pending_joins() > 0)
      if (!admit_workers()) return;
    return;
  }
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
      // Refused: the job ended (its rank 0 refuses whoever still waits) or it is full (max_ranks), or it stopped
      // (refuse_waiting_ranks: the survivors could not go on), which fails this rank too, with their reason.
      if (e.status() != Status::kUnsupported || std::string(e.what()).find("refused") == std::string::npos) throw;
      if (std::string(e.what()).find(kJobStopped) != std::string::npos)
        TANDEM_THROW(Status::kPeerFailure, "elastic: spare world rank {} stops with the grid it waited for: {}",
                     spare_label_, e.what());
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

std::unique_ptr<comm::Communicator> ParallelTrainer::split_workers_first(comm::Communicator& grown) const {
  // Keys every rank knows alone: old workers keep their order, joiners (after every old rank in `grown`) follow
  // them, and the servers (old ranks) come last in their order.
  constexpr int kJoiners = 1 << 20, kServers = 1 << 21;
  const int r = grown.rank();
  return grown.split(0, pc_.joining ? kJoiners + r : grid_.server ? kServers + r : r);
}

namespace {

// The reordered world's rank -> the rank it had before (-1: a joiner), for W workers, k joiners and S servers.
std::vector<int> workers_first_from(int W, int k, int S) {
  std::vector<int> from(static_cast<size_t>(W + k + S), -1);
  for (int i = 0; i < W; ++i) from[static_cast<size_t>(i)] = i;
  for (int s = 0; s < S; ++s) from[static_cast<size_t>(W + k + s)] = W + s;
  return from;
}

}  // namespace

std::vector<int> ParallelTrainer::grown_labels(const std::vector<int>& from, const std::vector<int>& old_labels) const {
  int next = initial_world_;
  for (int r : old_labels) next = std::max(next, r + 1);
  for (int r : lost_) next = std::max(next, r + 1);
  std::vector<int> labels(from.size());
  for (size_t i = 0; i < from.size(); ++i) labels[i] = from[i] >= 0 ? old_labels[static_cast<size_t>(from[i])] : next++;
  return labels;
}

void ParallelTrainer::share_ownership(comm::Communicator& reordered, std::vector<int>& from) {
  // The running job's shape from its rank 0 (a worker): W workers, then S servers; the joiners sit between them.
  // With it the ownership of the shards (after a server loss: fail_over_servers'), which every old rank must hold
  // alike and a joiner takes.
  const SyncProgram* mine = ps_ ? &ps_->program() : nullptr;
  int64_t head[5] = {grid_.dp, grid_.servers, mine ? mine->replicas : 0,
                     mine ? static_cast<int64_t>(mine->shards.size()) : 0,
                     mine ? static_cast<int64_t>(mine->pieces.size()) : 0};
  reordered.broadcast(head, 5, DType::kI64, 0)->wait();
  const int W = static_cast<int>(head[0]), S = static_cast<int>(head[1]), n = W + S;
  const int k = reordered.size() - n;
  TANDEM_CHECK(W >= 1 && S >= 1 && k >= 1 && head[3] >= S && head[4] >= 0, Status::kInternal,
               "grow: a world of {} ranks cannot hold {} workers, {} servers ({} shards) and a joiner",
               reordered.size(), W, S, head[3]);
  const auto NS = static_cast<size_t>(head[3]), NP = static_cast<size_t>(head[4]);
  std::vector<int64_t> table(3 * NS + 4 * NP, -1);
  if (mine != nullptr && mine->shards.size() == NS && mine->pieces.size() == NP) {
    for (size_t i = 0; i < NS; ++i) {
      const KeyRange& kr = mine->shards[i];
      std::copy_n(std::array<int64_t, 3>{kr.server, kr.begin, kr.end}.begin(), 3, table.begin() + 3 * i);
    }
    for (size_t i = 0; i < NP; ++i) {
      const BucketPiece& bp = mine->pieces[i];
      std::copy_n(std::array<int64_t, 4>{bp.bucket, bp.server, bp.begin, bp.end}.begin(), 4,
                  table.begin() + 3 * NS + 4 * i);
    }
  }
  std::vector<int64_t> rank0 = table;
  if (!rank0.empty()) reordered.broadcast(rank0.data(), rank0.size(), DType::kI64, 0)->wait();
  // Every old rank holds the ownership it re-formed to; one that differs from rank 0's fails the admission everywhere.
  int64_t differs = mine != nullptr && table != rank0 ? reordered.rank() + 1 : 0;
  reordered.allreduce(&differs, &differs, 1, DType::kI64, ReduceOp::kMax)->wait();
  TANDEM_CHECK(differs == 0, Status::kMismatch,
               "grow: rank {} of the grown world holds another ownership of the parameter servers' shards than rank 0 "
               "(the ranks re-formed differently after a server loss); the joiners are not admitted",
               differs - 1);
  ownership_ = SyncProgram{};
  ownership_.servers = S;
  ownership_.replicas = static_cast<int32_t>(head[2]);
  for (size_t i = 0; i < NS; ++i)
    ownership_.shards.push_back(KeyRange{static_cast<int32_t>(rank0[3 * i]), rank0[3 * i + 1], rank0[3 * i + 2]});
  for (size_t i = 0; i < NP; ++i) {
    const int64_t* e = rank0.data() + 3 * NS + 4 * i;
    ownership_.pieces.push_back(BucketPiece{static_cast<int32_t>(e[0]), static_cast<int32_t>(e[1]), e[2], e[3]});
  }
  from = workers_first_from(W, k, S);
}

CompiledJob ParallelTrainer::compile_grown(Job job) const {
  job.parallel.dp = 0;                    // resolved again at the new width
  job.parallel.servers = grid_.servers;   // the servers running now (fewer after a server loss)
  job.parallel.server_replicas = ownership_.replicas;
  CompiledJob cj = compile_job(std::move(job), grid_.world, nullptr);  // pp = 1: no measured cut, nothing collective
  adopt_ownership(cj.sync, ownership_.shards, ownership_.pieces, ownership_.replicas, cj.job.optimizer);
  return cj;
}

bool ParallelTrainer::admit_workers() {
  const auto t0 = std::chrono::steady_clock::now();
  // After a server loss a joiner is a worker too: the surviving servers keep the shards they own (their own and the
  // ones taken over), and the joiner learns that ownership in share_ownership.
  comm::GrowOptions o;
  o.max_ranks = pc_.max_ranks;
  std::unique_ptr<comm::Communicator> grown = own_comm_->grow(o);  // all or nothing (the old ranks' vote)
  if (!grown) return false;
  const int before = grid_.world, workers_before = grid_.dp;
  take_snapshot();
  // ---- the admission is a transaction (issue #17: never two views at once; the re-form's, ParameterServerSync::
  //      grow). The trainer's state before it is set aside; the reordered world is the first thing built on the
  //      grown one, and from then on the trainer lives on it whatever happens: a failure anywhere below surfaces on
  //      it, every survivor shrinks it (elastic_retry -> recover) and settle_ps_view either adopts the grown view
  //      (some rank committed it) or puts this state back (none did). A joiner whose admission fails leaves. ----
  admission_undo_ = std::make_unique<AdmissionUndo>(AdmissionUndo{
      grid_, config_, job_, pc_, initial_dp_, initial_world_, sampler_dp_, ps_workers_, schedule_epoch_steps_, taken_,
      taken_epoch_, taken_position_, schedule_, lr_scale_, snapshot_, sampler_, ps_labels_, ownership_});
  std::unique_ptr<comm::Communicator> own;
  try {
    own = split_workers_first(*grown);
    reform_test_point("split");
  } catch (const Error& e) {
    // A rank lost inside this one exchange can leave it completed on some ranks and cut off on others, which then
    // hold no common communicator to re-form over (the others went on over the reordered one). This rank cannot tell
    // which, so it stops here, cleanly and saying why, rather than shrink the old communicator alone; the ones that
    // completed the split meet its loss there and absorb it with the other (the admission then undone).
    if (e.status() != Status::kPeerFailure && e.status() != Status::kTimeout) throw;
    left_admission_ = true;
    TANDEM_THROW(Status::kPeerFailure,
                 "elastic: world rank {}: a rank was lost inside the exchange that orders the grown world for an "
                 "admission of workers; the others may have completed it and gone on without this rank, which cannot "
                 "tell, so it leaves the job ({})",
                 world_rank(), in_world_ranks(e.what()));
  }
  const std::vector<int> old_labels = members_;
  members_ = grown_labels(workers_first_from(grid_.dp, grown->size() - grid_.world, grid_.servers), old_labels);
  retired_.push_back(std::move(own_comm_));
  if (dp_comm_) retired_.push_back(std::move(dp_comm_));
  if (grown_) retired_.push_back(std::move(grown_));
  grown_ = std::move(grown);
  own_comm_ = std::move(own);
  world_ = own_comm_.get();
  grid_.world = world_->size();
  grid_.rank = world_->rank();
  // The joiners' constructor, mirrored collective by collective: the job's shape and ownership, the settings, the job
  // compiled at the new width, the workers' group and replicated state, the barrier; then every rank takes rank 0's
  // progress and the servers' parameters, and votes (ParameterServerSync::grow).
  std::vector<int> from;
  share_ownership(*world_, from);
  grid_.dp = grid_.world - grid_.servers;
  grid_.dp_rank = grid_.server ? 0 : grid_.rank;
  grid_.server_index = grid_.server ? grid_.rank - grid_.dp : -1;
  config_.world = grid_.dp;
  config_.rank = grid_.dp_rank;
  agree_on_settings(true);
  job_ = compile_grown(job_.job);
  pc_.dp = grid_.dp;
  if (grid_.dp > 1) dp_comm_ = world_->split(grid_.server ? -1 : 0, grid_.dp_rank);
  broadcast_replica_state();
  world_->barrier()->wait();
  share_grown_state(from, &old_labels);
  std::vector<int> from_worker(from.begin(), from.begin() + grid_.dp);
  ps_voting_labels_ = members_;
  ps_voting_workers_ = grid_.dp;
  ps_->grow(*world_, from_worker, job_.sync, optimizer_->steps(), lr_scale_);
  admission_undo_.reset();  // committed
  note_ps_membership();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  last_admission_ms_ = ms;
  log::warn("elastic: {} worker(s) joined at step {}; {} ranks go on (world ranks {}; {} worker(s) and {} server(s)) "
            "after {:.0f} ms: the servers expect {} worker(s) from the next step{}, learning rate x {:.4g}, epoch {} "
            "continues at sample {} of the new shards (seen by {}; {} workers before; view {})",
            grid_.world - before, optimizer_->steps(), grid_.world, fmt::join(members_, ", "), grid_.dp, grid_.servers,
            ms, grid_.dp,
            pc_.strategy == Strategy::kSsp ? fmt::format(" (the joiners start at clock {}, the slowest)",
                                                         optimizer_->steps())
                                           : std::string(),
            lr_scale_, sampler_.epoch(), sampler_.position(), rank_label(world_rank()), workers_before,
            ps_->view_epoch());
  return true;
}

void ParallelTrainer::undo_admission() {
  AdmissionUndo& u = *admission_undo_;
  const int world = grid_.world, rank = grid_.rank;  // the survivors' communicator's (shrink_group)
  grid_ = u.grid;
  grid_.world = world;
  grid_.rank = rank;
  config_ = u.config;
  job_ = std::move(u.job);
  pc_ = u.pc;
  initial_dp_ = u.initial_dp;
  initial_world_ = u.initial_world;
  sampler_dp_ = u.sampler_dp;
  ps_workers_ = u.ps_workers;
  schedule_epoch_steps_ = u.schedule_epoch_steps;
  taken_ = u.taken;
  taken_epoch_ = u.taken_epoch;
  taken_position_ = u.taken_position;
  schedule_ = u.schedule;
  lr_scale_ = u.lr_scale;
  snapshot_ = std::move(u.snapshot);
  sampler_ = u.sampler;
  ps_labels_ = std::move(u.ps_labels);
  ownership_ = std::move(u.ownership);
  admission_undo_.reset();
  restore_snapshot(false);
}

void ParallelTrainer::share_grown_state(const std::vector<int>& from, const std::vector<int>* old_labels) {
  // Who is who (world ranks: joiners take numbers after every rank the job ever had), the job's starting width
  // (the learning-rate rule), the epoch length its schedule was laid out with and its elastic settings.
  // And the epoch's closing collectives completed so far (a re-form compares the counts: closing_plan).
  int64_t head[8] = {initial_dp_, initial_world_, schedule_epoch_steps_, closings_, pc_.min_ranks, pc_.max_ranks,
                     pc_.join_poll_steps, static_cast<int64_t>(closed_phase_)};
  std::vector<int64_t> labels(static_cast<size_t>(grid_.world), -1);
  if (grid_.rank == 0) {
    const std::vector<int>& old = old_labels != nullptr ? *old_labels : members_;
    std::vector<int> was = from;
    if (was.empty())
      for (size_t i = 0; i < labels.size(); ++i) was.push_back(i < old.size() ? static_cast<int>(i) : -1);
    const std::vector<int> mine = grown_labels(was, old);
    labels.assign(mine.begin(), mine.end());
  }
  world_->broadcast(head, 8, DType::kI64, 0)->wait();
  world_->broadcast(labels.data(), labels.size(), DType::kI64, 0)->wait();
  initial_dp_ = static_cast<int>(head[0]);
  initial_world_ = static_cast<int>(head[1]);
  closings_ = head[3];
  closed_phase_ = static_cast<Phase>(head[7]);
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
