// Elastic pipeline and hybrid DP x PP (issue #17; the rule is in parallel_trainer.hpp): after a loss the survivors
// re-form a grid. Every pipeline stage's state comes from a surviving replica of that stage (or, when none survived,
// from the last checkpoint), assembled into the whole model and dealt out again at the new grid -- the resharding
// of resume-at-any-world-size, done in memory.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"
#include "engine/parallel/parallel_trainer.hpp"

namespace tandem::engine::parallel {

namespace {

constexpr uint32_t kTagStageState = 15;  // the survivors' communicator: a stage's slice of the state, to rank 0

// The grid rule (parallel_trainer.hpp): pp' = min(pp0, n), dp' = floor(n / pp').
std::pair<int, int> grid_for(int n, int pp0) {
  const int pp = std::max(1, std::min(pp0, n));
  return {n / pp, pp};
}

// The new grid's places (grid rank g = dp_rank x pp + stage -> rank of the re-forming group, whose row r of `all`,
// `width` values, has the stage it holds, -1 for none, first). At the depth the state is held at, stage s's places go first to the ranks
// holding s, the lowest first: each keeps its stage (and its layers) where it can. Every place left goes, in grid
// order, to the ranks left over, ranks holding state first, then the new ones, each in rank order (so the group's rank
// 0, which holds state, always has a place). The ranks without a place become spares.
std::vector<int> place_grid(const std::vector<int64_t>& all, size_t width, int dp, int pp, int old_pp) {
  const int n = static_cast<int>(all.size() / width);
  const auto stage = [&](int r) { return all[width * static_cast<size_t>(r)]; };
  std::vector<int> prefer;
  for (int pass = 0; pass < 2; ++pass)
    for (int r = 0; r < n; ++r)
      if ((stage(r) >= 0) == (pass == 0)) prefer.push_back(r);
  std::vector<int> place(static_cast<size_t>(dp * pp), -1);
  std::vector<bool> placed(static_cast<size_t>(n), false);
  if (pp == old_pp) {
    for (int s = 0; s < pp; ++s) {
      int d = 0;
      for (int r : prefer)
        if (d < dp && stage(r) == s) {
          place[static_cast<size_t>(d++ * pp + s)] = r;
          placed[static_cast<size_t>(r)] = true;
        }
    }
  }
  const auto open = static_cast<size_t>(std::count(place.begin(), place.end(), -1));
  std::vector<int> rest;
  for (int r : prefer)
    if (!placed[static_cast<size_t>(r)] && rest.size() < open) rest.push_back(r);
  std::sort(rest.begin(), rest.end());
  size_t k = 0;
  for (int& p : place)
    if (p < 0) p = rest[k++];
  return place;
}

void put_floats(compute::Backend& be, const float* src, Tensor dst) {
  if (dst.numel() == 0) return;
  be.copy(Tensor::wrap(const_cast<float*>(src), dst.shape(), DType::kF32), dst);
}

}  // namespace

bool ParallelTrainer::reforms_grid() const noexcept {
  return pc_.elastic && (pc_.strategy == Strategy::kHybrid || pc_.strategy == Strategy::kPipeline);
}

bool ParallelTrainer::probe_loss(const std::string& why) {
  // Whoever waits on this rank in a stage or replica group fails at once, instead of at its deadline (the
  // survivors then all reach the shrink within its window)...
  for (comm::Communicator* c : {pipe_comm_.get(), dp_comm_.get()}) {
    try {
      if (c != nullptr && !c->is_failed()) c->abort(why);
    } catch (...) {
      // best effort
    }
  }
  if (own_comm_ == nullptr) return false;
  if (own_comm_->is_failed()) return true;
  // ... and the trainer's own communicator, over every rank, shows whether a rank is gone.
  try {
    own_comm_->barrier()->wait();
  } catch (const Error&) {
    return own_comm_->is_failed();
  }
  return false;
}

void ParallelTrainer::regrid(int pp) {
  // The constructor's steps 1, 3 and 4 at the new grid, on world_ (the grid's ranks).
  executor_.reset();
  reducer_.reset();
  retired_.push_back(std::move(pipe_comm_));
  retired_.push_back(std::move(dp_comm_));
  if (pp != pc_.pp) pc_.boundaries.clear();  // an explicit cut was for the old depth
  pc_.dp = 0;
  pc_.pp = pp;
  if (pc_.strategy == Strategy::kPipeline && world_->size() / pp > 1) pc_.strategy = Strategy::kHybrid;  // widened
  grid_ = resolve_grid(pc_, world_->size(), world_->rank(), static_cast<int64_t>(model_.num_layers()),
                       config_.batch_size);
  config_.world = grid_.dp;
  config_.rank = grid_.dp_rank;
  const data::LoaderOptions lo = loader_->options();
  loader_.reset();
  sampler_ = data::DistributedSampler(train_.size(), grid_.dp, grid_.dp_rank, true, config_.seed);
  loader_ = std::make_unique<data::Loader>(train_, sampler_, lo);
  sampler_dp_ = grid_.dp;
  Job job = job_.job;
  job.parallel = pc_;
  job_ = compile_job(std::move(job), grid_.world, [this] { return measure_layer_costs(); });
  pc_ = job_.job.parallel;
  const StageProgram& mine = job_.stages[static_cast<size_t>(grid_.stage)];
  first_ = mine.first_layer;
  end_ = mine.end_layer;
  model_.hold(static_cast<size_t>(first_), static_cast<size_t>(end_));
  if (grid_.pp > 1) pipe_comm_ = world_->split(grid_.dp_rank, grid_.stage);
  if (grid_.dp > 1) dp_comm_ = world_->split(grid_.stage, grid_.dp_rank);
  optimizer_ = std::make_unique<optim::Optimizer>(
      model_.backend(), config_.optimizer,
      std::vector<Tensor>{model_.range_params(static_cast<size_t>(first_), static_cast<size_t>(end_))});
  executor_ = std::make_unique<StageExecutor>(model_, grid_.stage, grid_.pp, first_, end_, pipe_comm_.get(), nullptr,
                                              tracer_);
}

bool ParallelTrainer::reform_grid(const std::string& why, Phase phase) {
  // Waiting ranks are drafted only when every survivor was cut off in a step: they enter the grid at a step, not in
  // the middle of the epoch's closing collectives. The survivors decide it together (pending_joins is collective).
  int64_t in_step = phase == Phase::kStep ? 1 : 0;
  own_comm_->allreduce(&in_step, &in_step, 1, DType::kI64, ReduceOp::kMin)->wait();
  reform_phase_ = phase;
  try {
    form_grid(why, in_step != 0);
  } catch (...) {
    reform_phase_ = Phase::kStep;
    throw;
  }
  reform_phase_ = Phase::kStep;
  return false;
}

int ParallelTrainer::to_draft(int n, int64_t waiting) const {
  if (waiting <= 0) return 0;
  int64_t m = n + waiting;
  if (pc_.max_ranks > 0) m = std::min<int64_t>(m, pc_.max_ranks);
  const auto [dp, pp] = grid_for(static_cast<int>(m), launch_pp_);
  return std::max(0, dp * pp - n);
}

std::vector<int> ParallelTrainer::share_grid_head(int& old_pp) {
  comm::Communicator& S = *own_comm_;
  const int n = S.size();
  // Every rank's label (a joiner: -1): rank 0 numbers the joiners after every world rank the job ever had.
  const int64_t mine = world_rank();
  std::vector<int64_t> labels(static_cast<size_t>(n));
  S.allgather(&mine, labels.data(), 1, DType::kI64)->wait();
  int64_t head[12] = {initial_dp_, initial_world_, schedule_epoch_steps_, pc_.min_ranks, pc_.max_ranks,
                      pc_.join_poll_steps, launch_pp_, old_pp, static_cast<int64_t>(pc_.strategy),
                      static_cast<int64_t>(pc_.boundaries.size()), static_cast<int64_t>(launch_strategy_), 0};
  if (S.rank() == 0) {
    int64_t next = initial_world_;
    for (int64_t r : labels) next = std::max(next, r + 1);
    for (int r : lost_) next = std::max<int64_t>(next, r + 1);
    for (int64_t& r : labels)
      if (r < 0) r = next++;
  }
  S.broadcast(head, 12, DType::kI64, 0)->wait();
  S.broadcast(labels.data(), labels.size(), DType::kI64, 0)->wait();
  std::vector<int64_t> bounds(static_cast<size_t>(head[9]));
  for (size_t i = 0; i < bounds.size() && S.rank() == 0; ++i) bounds[i] = pc_.boundaries[i];
  if (!bounds.empty()) S.broadcast(bounds.data(), bounds.size(), DType::kI64, 0)->wait();
  initial_dp_ = static_cast<int>(head[0]);
  initial_world_ = static_cast<int>(head[1]);
  pc_.min_ranks = static_cast<int>(head[3]);
  pc_.max_ranks = static_cast<int>(head[4]);
  pc_.join_poll_steps = static_cast<int>(head[5]);
  launch_pp_ = static_cast<int>(head[6]);
  old_pp = static_cast<int>(head[7]);
  launch_strategy_ = static_cast<Strategy>(head[10]);
  if (grid_.stage < 0) {  // a joiner or spare: the grid that holds the state is the job's, as it is now
    pc_.strategy = static_cast<Strategy>(head[8]);
    pc_.pp = old_pp;
    pc_.boundaries.assign(bounds.begin(), bounds.end());
  }
  if (schedule_epoch_steps_ != head[2]) {
    schedule_epoch_steps_ = head[2];
    schedule_ = optim::parse_schedule(config_.schedule, config_.optimizer.lr, schedule_epoch_steps_, config_.epochs);
  }
  return {labels.begin(), labels.end()};
}

void ParallelTrainer::form_grid(const std::string& why, bool draft) {
  // 0. After a loss in a step: ranks waiting to join (spares, joiners) come in first when they make a wider grid.
  if (draft) {
    const int k = to_draft(own_comm_->size(), own_comm_->pending_joins());
    if (k > 0) {
      comm::GrowOptions o;
      o.max_ranks = pc_.max_ranks;
      o.limit = k;
      std::unique_ptr<comm::Communicator> grown = own_comm_->grow(o);
      if (grown) {
        enter_grown(std::move(grown), nullptr);
        return;
      }
    }
  }
  comm::Communicator& S = *own_comm_;  // ranks holding state first (in their old order), then the new ones
  const int n = S.size();
  const bool holds = grid_.stage >= 0;
  int old_pp = holds ? grid_.pp : 0;
  agree_on_settings(true);
  const std::vector<int> labels = share_grid_head(old_pp);
  const std::vector<int32_t> old_bounds = job_.boundaries;  // on the ranks that hold state
  // 1. Where every rank is: its stage (-1: no state), the progress of its last two snapshots (a rank may have
  //    completed the step the others were cut off in; they all roll back to the newest step every one of them has),
  //    the work it was cut off in and the epoch's closing collectives it completed (closings_, and the last one's
  //    phase): at an epoch's end the survivors may be a collective apart (see closing_plan).
  constexpr size_t W = kPlanWidth;
  const int64_t mine[W] = {holds ? grid_.stage : -1,
                           holds ? progress_of(snapshot_) : -1,
                           holds && has_prev_ ? progress_of(prev_snapshot_) : -1,
                           static_cast<int64_t>(reform_phase_),
                           closings_reported(),
                           static_cast<int64_t>(closed_phase_)};
  std::vector<int64_t> all(W * static_cast<size_t>(n));
  S.allgather(mine, all.data(), W, DType::kI64)->wait();
  const auto at = [&](int r, int k) { return all[W * static_cast<size_t>(r) + static_cast<size_t>(k)]; };
  int64_t P = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < n; ++r)
    if (at(r, 0) >= 0) P = std::min(P, at(r, 1));
  TANDEM_CHECK(at(0, 0) >= 0, Status::kInternal, "elastic: rank 0 of the re-formed group holds no state ({})", why);
  for (int r = 0; r < n; ++r)
    TANDEM_CHECK(at(r, 0) < 0 || at(r, 1) == P || at(r, 2) == P, Status::kPeerFailure,
                 "elastic: cannot re-form after {}: world rank {} has no state of step {} (it is at step {}); resume "
                 "from the last checkpoint",
                 why, labels[static_cast<size_t>(r)], P, at(r, 1));
  const int closed_from = closing_plan(why, all, W, labels, P);
  std::vector<int> source(static_cast<size_t>(old_pp), -1);  // the lowest rank holding each stage
  for (int r = n - 1; r >= 0; --r)
    if (at(r, 0) >= 0) source[static_cast<size_t>(at(r, 0))] = r;
  std::vector<int> missing;
  for (int s = 0; s < old_pp; ++s)
    if (source[static_cast<size_t>(s)] < 0) missing.push_back(s);
  const bool from_checkpoint = !missing.empty();
  if (from_checkpoint) {
    TANDEM_CHECK(!pc_.elastic_checkpoint.empty() && std::filesystem::exists(pc_.elastic_checkpoint),
                 Status::kPeerFailure,
                 "elastic: pipeline stage(s) {} lost on every replica ({}) and {}: its parameters exist nowhere, so "
                 "the job stops; restart it from a checkpoint",
                 fmt::join(missing, ", "), why,
                 pc_.elastic_checkpoint.empty() ? std::string("no checkpoint to restore it from (elastic_checkpoint)")
                                                : fmt::format("checkpoint '{}' does not exist", pc_.elastic_checkpoint));
  }
  // 2. The whole model at step P, assembled on rank 0 (which holds state) from one replica of each stage.
  const Snapshot empty;
  const Snapshot& snap = !holds ? empty : progress_of(snapshot_) == P ? snapshot_ : prev_snapshot_;
  const auto P_all = static_cast<size_t>(model_.total_params()), B_all = static_cast<size_t>(model_.total_buffers());
  int64_t K = static_cast<int64_t>(snap.state.size());  // the optimizer's state tensors (a joiner learns how many)
  S.broadcast(&K, 1, DType::kI64, 0)->wait();
  std::vector<float> params, buffers, state;  // state: K tensors of P_all each, back to back
  if (!from_checkpoint) {
    std::vector<float> packed = snap.params;
    packed.insert(packed.end(), snap.buffers.begin(), snap.buffers.end());
    for (const std::vector<float>& v : snap.state) packed.insert(packed.end(), v.begin(), v.end());
    if (S.rank() == 0) {
      params.resize(P_all);
      buffers.resize(B_all);
      state.resize(static_cast<size_t>(K) * P_all);
      for (int s = 0; s < old_pp; ++s) {
        const auto f = static_cast<size_t>(old_bounds[static_cast<size_t>(s)]);
        const auto e = static_cast<size_t>(old_bounds[static_cast<size_t>(s) + 1]);
        const auto p0 = static_cast<size_t>(model_.param_offset(f)), p1 = static_cast<size_t>(model_.param_offset(e));
        const auto q0 = static_cast<size_t>(model_.buffer_offset(f)), q1 = static_cast<size_t>(model_.buffer_offset(e));
        const size_t np = p1 - p0, nb = q1 - q0;
        std::vector<float> theirs(np + nb + static_cast<size_t>(K) * np);
        if (source[static_cast<size_t>(s)] == 0) {
          TANDEM_CHECK(packed.size() == theirs.size(), Status::kInternal, "elastic: stage {} state of {} floats, not {}",
                       s, packed.size(), theirs.size());
          theirs = packed;
        } else if (!theirs.empty()) {
          S.recv(theirs.data(), theirs.size(), DType::kF32, source[static_cast<size_t>(s)], kTagStageState)->wait();
        }
        std::copy_n(theirs.begin(), np, params.begin() + static_cast<std::ptrdiff_t>(p0));
        std::copy_n(theirs.begin() + static_cast<std::ptrdiff_t>(np), nb, buffers.begin() + static_cast<std::ptrdiff_t>(q0));
        for (size_t k = 0; k < static_cast<size_t>(K); ++k)
          std::copy_n(theirs.begin() + static_cast<std::ptrdiff_t>(np + nb + k * np), np,
                      state.begin() + static_cast<std::ptrdiff_t>(k * P_all + p0));
      }
    } else if (holds && source[static_cast<size_t>(grid_.stage)] == S.rank() && !packed.empty()) {
      S.send(packed.data(), packed.size(), DType::kF32, 0, kTagStageState)->wait();
    }
  }
  // A closing collective that some survivors completed stands: the ones cut off in it take its result from the
  // lowest rank that completed it (train_epoch and evaluate return it instead of running it again).
  const bool adopts = holds && closed_from >= 0 && closings_ < at(closed_from, 4);
  if (closed_from >= 0)
    share_closing(S, closed_from, adopts, reform_phase_, labels[static_cast<size_t>(closed_from)],
                  static_cast<Phase>(at(closed_from, 3)));
  if (!holds) {  // a joiner or spare counts the closing collectives from where the grid is (closing_plan compares them)
    int top = 0;
    for (int r = 1; r < n; ++r)
      if (at(r, 0) >= 0 && at(r, 4) > at(top, 4)) top = r;
    closings_ = at(top, 4);
    closed_phase_ = static_cast<Phase>(at(top, 5));
  }
  // The epoch's figures at step P, summed over every rank here (spares and ranks changing stage included); one rank
  // of the new grid holds them from now on (below). A rank that takes the epoch's sums has its figures in them.
  double figures[3] = {snap.figures.loss_sum, static_cast<double>(snap.figures.correct),
                       static_cast<double>(snap.figures.scored)};
  if (adopts && reform_phase_ == Phase::kEpochSums) figures[0] = figures[1] = figures[2] = 0;
  S.allreduce(figures, figures, 3, DType::kF64, ReduceOp::kSum)->wait();
  figures_ = EpochFigures{};
  // 3. The new grid (grid_for; place: grid rank -> rank here); the ranks beyond dp' x pp' become spares.
  const auto [dp, pp] = grid_for(n, launch_pp_);
  const std::vector<int> place = place_grid(all, W, dp, pp, old_pp);
  const auto it = std::find(place.begin(), place.end(), S.rank());
  const bool in_grid = it != place.end();
  std::unique_ptr<comm::Communicator> G = S.split(in_grid ? 0 : -1, static_cast<int>(it - place.begin()));
  // The state's root in the new grid: rank 0 here, which assembled the model (it always has a place).
  const int root = static_cast<int>(std::find(place.begin(), place.end(), 0) - place.begin());
  members_.clear();
  for (int r : place) members_.push_back(labels[static_cast<size_t>(r)]);
  if (!in_grid) {
    spare_label_ = labels[static_cast<size_t>(S.rank())];
    grid_.dp = dp;
    grid_.pp = pp;
    grid_.world = dp * pp;
    become_spare(&S);
    log::warn("elastic: world rank {} waits as a spare: the grid {} x {} (dp x pp) of {} ranks has no place for it; it "
              "is drafted when the grid can widen",
              spare_label_, dp, pp, n);
    return;
  }
  spare_ = false;
  retired_.push_back(std::move(own_comm_));
  own_comm_ = std::move(G);
  world_ = own_comm_.get();
  regrid(pp);
  has_prev_ = false;
  snapshot_valid_ = false;  // the snapshots were of the old grid
  // 4. Every rank takes its new stage's slices (from_checkpoint: as load_checkpoint does from the file).
  if (from_checkpoint) {
    load_checkpoint(pc_.elastic_checkpoint);
    log::warn("elastic: pipeline stage(s) {} had no surviving replica: restored from checkpoint '{}' (step {})",
              fmt::join(missing, ", "), pc_.elastic_checkpoint, optimizer_->steps());
  } else {
    int64_t progress[10] = {snap.steps, snap.completed_epochs, static_cast<int64_t>(snap.sampler.seed),
                            snap.sampler.epoch, snap.sampler.position, snap.sampler_world};
    for (size_t k = 0; k < 4; ++k) progress[6 + k] = static_cast<int64_t>(snap.rng[k]);
    world_->broadcast(progress, 10, DType::kI64, root)->wait();
    params.resize(P_all);
    buffers.resize(B_all);
    state.resize(static_cast<size_t>(K) * P_all);
    if (P_all > 0) world_->broadcast(params.data(), P_all, DType::kF32, root)->wait();
    if (B_all > 0) world_->broadcast(buffers.data(), B_all, DType::kF32, root)->wait();
    if (!state.empty()) world_->broadcast(state.data(), state.size(), DType::kF32, root)->wait();
    compute::Backend& be = model_.backend();
    const auto first = static_cast<size_t>(first_), end = static_cast<size_t>(end_);
    const int64_t p0 = model_.param_offset(first), p1 = model_.param_offset(end), q0 = model_.buffer_offset(first);
    put_floats(be, params.data() + p0, model_.range_params(first, end));
    put_floats(be, buffers.data() + q0, model_.range_buffers(first, end));
    std::vector<Tensor> st;
    for (size_t k = 0; k < static_cast<size_t>(K) && p1 > p0; ++k)
      st.push_back(Tensor::wrap(state.data() + k * P_all + static_cast<size_t>(p0), Shape{p1 - p0}, DType::kF32));
    optimizer_->restore(progress[0], st);
    completed_epochs_ = progress[1];
    Rng::State rng{};
    for (size_t k = 0; k < 4; ++k) rng[k] = static_cast<uint64_t>(progress[6 + k]);
    rng_.set_state(rng);
    // The epoch's global order kept: g samples taken at the old width continue at floor(g / dp').
    data::SamplerState s{static_cast<uint64_t>(progress[2]), progress[3], progress[4]};
    const data::DistributedSampler before(train_.size(), static_cast<int>(progress[5]), 0, false, 0);
    s.position = s.position >= before.shard_size() ? sampler_.shard_size() : s.position * progress[5] / grid_.dp;
    sampler_.restore(s);
    loader_->reset();
    model_.zero_grads();
    // The root was in the grid before, so it is in this epoch's train_epoch (a joiner may be about to enter one).
    if (world_->rank() == root)
      figures_ = EpochFigures{figures[0], std::llround(figures[1]), std::llround(figures[2])};
  }
  lr_scale_ = static_cast<double>(grid_.dp) / initial_dp_;
  log::warn("elastic: the grid re-formed at {} x {} (dp x pp) over world ranks {} from step {}; each stage's state "
            "from {}; learning rate x {:.4g}",
            grid_.dp, grid_.pp, fmt::join(members_, ", "), optimizer_->steps(),
            from_checkpoint ? "the checkpoint" : "a replica of it", lr_scale_);
}

int ParallelTrainer::closing_plan(const std::string& why, const std::vector<int64_t>& all, size_t width,
                                  const std::vector<int>& labels, int64_t P) const {
  // The epoch's closing collectives (sums, time split, evaluation) run over every rank of the grid in the same order,
  // so a rank can complete one only when every other rank has entered it: the survivors are at most one collective
  // apart, and all hold the step P (they changed no state since). Those one behind were cut off in the collective
  // the others completed; they take its result (returned: the lowest rank that completed it, -1 when all completed
  // the same ones). A rank that completed the epoch's last step and was cut off in the sums may go back to P before
  // it (another rank was cut off in that step): it redoes the step with the others (train_epoch), then the sums.
  const auto at = [&](int r, int k) { return all[width * static_cast<size_t>(r) + static_cast<size_t>(k)]; };
  const int n = static_cast<int>(all.size() / width);
  int top = -1;  // the lowest rank holding state that completed the most closing collectives
  for (int r = 0; r < n; ++r)
    if (at(r, 0) >= 0 && (top < 0 || at(r, 4) > at(top, 4))) top = r;
  const auto cannot = [&](int r, const std::string& what) {
    TANDEM_THROW(Status::kPeerFailure,
                 "elastic: cannot re-form after {}: world rank {} {} (world rank {} completed {} of the epochs' "
                 "closing collectives, the last its {}, and is at step {}); resume from the last checkpoint",
                 why, labels[static_cast<size_t>(r)], what, labels[static_cast<size_t>(top)], at(top, 4),
                 phase_name(static_cast<Phase>(at(top, 5))), at(top, 1));
  };
  bool behind = false;
  for (int r = 0; r < n; ++r) {
    if (at(r, 0) < 0) continue;
    const auto phase = static_cast<Phase>(at(r, 3));
    const bool closing = phase == Phase::kEpochSums || phase == Phase::kSplit || phase == Phase::kEvaluate;
    if (at(r, 4) == at(top, 4)) {
      // Gone back before a step it completed: only from the epoch's sums, before any rank completed them.
      if (at(r, 1) != P && closing && phase != Phase::kEpochSums)
        cannot(r, fmt::format("completed step {} and went on to the {}, but another survivor has only step {}",
                              at(r, 1), phase_name(phase), P));
      continue;
    }
    behind = true;
    if (at(r, 4) + 1 != at(top, 4) || !closing || static_cast<Phase>(at(top, 5)) != phase || at(r, 1) != P)
      cannot(r, fmt::format("completed {} closing collective(s), at step {}, and was cut off in its {}", at(r, 4),
                            at(r, 1), phase_name(phase)));
  }
  return behind ? top : -1;
}

int64_t ParallelTrainer::closings_reported() const {
  const std::optional<int64_t> behind = settings::current()->integer("TANDEM_TEST_CLOSINGS_BEHIND");
  if (!behind || *behind != world_rank()) return closings_;
  log::warn("TANDEM_TEST_CLOSINGS_BEHIND: world rank {} reports {} closing collective(s), one fewer than it completed",
            world_rank(), closings_ - 1);
  return closings_ - 1;
}

void ParallelTrainer::share_closing(comm::Communicator& S, int from, bool adopts, Phase phase, int from_label,
                                    Phase from_phase) {
  std::vector<double> result = closed_result_;
  result.resize(kClosedResult);
  S.broadcast(result.data(), result.size(), DType::kF64, from)->wait();
  if (!adopts) return;
  adopted_closing_ = std::move(result);
  // The ones that completed it went on into a step: they were past the checkpoint save that `tandem train` runs
  // between an epoch and the next (save_checkpoint: a loss there fails it, and they go on without it), so this rank
  // skips that save too rather than call its collectives alone.
  skip_save_ = from_phase == Phase::kStep;
  log::warn("elastic: world rank {} takes the result of the epoch's {} that world rank {} completed before the loss",
            world_rank(), phase_name(phase), from_label);
}

const char* ParallelTrainer::phase_name(Phase p) {
  switch (p) {
    case Phase::kStep:
      return "step";
    case Phase::kEpochSums:
      return "sums";
    case Phase::kSplit:
      return "time split";
    case Phase::kEvaluate:
      return "evaluation";
    case Phase::kSyncPoint:
      return "sync point";
  }
  return "work";
}

void ParallelTrainer::become_spare(comm::Communicator* via) {
  executor_.reset();
  reducer_.reset();
  retired_.push_back(std::move(pipe_comm_));
  retired_.push_back(std::move(dp_comm_));
  TANDEM_CHECK(own_comm_.get() == via, Status::kInternal, "elastic: a spare's communicator is not the trainer's");
  retired_.push_back(std::move(own_comm_));  // kept: the spare waits for admission through its store
  spare_via_ = via;
  world_ = nullptr;
  spare_ = true;
  grid_.rank = grid_.stage = grid_.dp_rank = -1;
  has_prev_ = false;
  snapshot_valid_ = false;
}

}  // namespace tandem::engine::parallel
