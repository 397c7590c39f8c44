#include "engine/parallel/schedule.hpp"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::engine::parallel {

const char* schedule_name(ScheduleKind k) noexcept {
  switch (k) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& s) {
  if (s == "gpipe") return ScheduleKind::kGPipe;
  if (s == "1f1b" || s == "1F1B") return ScheduleKind::kOneFOneB;
  TANDEM_THROW(Status::kInvalidArgument, "unknown pipeline schedule \"{}\" (gpipe, 1f1b)", s);
}

const char* stage_op_name(StageOpKind k) noexcept {
  switch (k) {
    case StageOpKind::kForward: return "forward";
    case StageOpKind::kBackward: return "backward";
    case StageOpKind::kSendActivation: return "send-activation";
    case StageOpKind::kRecvActivation: return "recv-activation";
    case StageOpKind::kSendGradient: return "send-gradient";
    case StageOpKind::kRecvGradient: return "recv-gradient";
    case StageOpKind::kAllreduceBucket: return "allreduce-bucket";
    case StageOpKind::kOptimizerStep: return "optimizer-step";
  }
  return "?";
}

std::string PipelinePlan::describe() const {
  size_t ops = 0, buckets = 0;
  for (const auto& sp : stage_plans) {
    ops += sp.ops.size();
    buckets += sp.buckets.size();
  }
  return fmt::format("{} stages={} micro_batches={} ops={} buckets={}", schedule_name(kind), stages, micro_batches,
                     ops, buckets);
}

std::vector<int64_t> micro_batch_sizes(int64_t batch, int32_t micro_batches) {
  TANDEM_REQUIRE(micro_batches >= 1, "micro-batches must be >= 1, got {}", micro_batches);
  TANDEM_REQUIRE(batch >= micro_batches, "batch {} cannot be split into {} micro-batches of at least one sample",
                 batch, micro_batches);
  std::vector<int64_t> out(static_cast<size_t>(micro_batches), batch / micro_batches);
  for (int64_t i = 0; i < batch % micro_batches; ++i) ++out[static_cast<size_t>(i)];
  return out;
}

std::vector<GradientBucket> make_buckets(int32_t first, int32_t end, const std::vector<uint64_t>& layer_grad_bytes,
                                         uint64_t bucket_bytes, const std::vector<uint64_t>& caps) {
  TANDEM_REQUIRE(first >= 0 && first <= end && static_cast<size_t>(end) <= layer_grad_bytes.size(),
                 "bucket layer range [{}, {}) is outside the model's {} layers", first, end, layer_grad_bytes.size());
  TANDEM_REQUIRE(bucket_bytes > 0, "bucket size must be > 0 bytes");
  for (size_t k = 0; k < caps.size(); ++k) TANDEM_REQUIRE(caps[k] > 0, "bucket {}'s size must be > 0 bytes", k);
  std::vector<GradientBucket> out;
  GradientBucket cur{end, end, 0};
  for (int32_t l = end - 1; l >= first; --l) {
    cur.first_layer = l;
    cur.bytes += layer_grad_bytes[static_cast<size_t>(l)];
    if (cur.bytes >= (out.size() < caps.size() ? caps[out.size()] : bucket_bytes)) {
      out.push_back(cur);
      cur = GradientBucket{l, l, 0};
    }
  }
  if (cur.bytes > 0) {
    cur.first_layer = first;  // trailing gradient-free layers join the last bucket
    out.push_back(cur);
  } else if (!out.empty()) {
    out.back().first_layer = first;
  }
  return out;
}

std::vector<int32_t> partition_layers(const std::vector<double>& cost, int32_t stages) {
  const int32_t L = static_cast<int32_t>(cost.size());
  TANDEM_REQUIRE(stages >= 1, "stages must be >= 1, got {}", stages);
  TANDEM_REQUIRE(stages <= L, "cannot cut {} layers into {} non-empty stages", L, stages);
  for (int32_t i = 0; i < L; ++i)
    TANDEM_REQUIRE(cost[i] >= 0 && cost[i] < std::numeric_limits<double>::infinity(),
                   "layer {} cost must be finite and >= 0, got {}", i, cost[i]);
  std::vector<double> prefix(L + 1, 0.0);
  for (int32_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + cost[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest possible largest-stage cost for layers [0, i) in s stages; cut[s][i] the
  // start of the last stage achieving it (earliest on ties).
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int32_t>> cut(stages + 1, std::vector<int32_t>(L + 1, -1));
  best[0][0] = 0;
  for (int32_t s = 1; s <= stages; ++s) {
    for (int32_t i = s; i <= L - (stages - s); ++i) {
      for (int32_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == inf) continue;
        double v = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (v < best[s][i]) {
          best[s][i] = v;
          cut[s][i] = j;
        }
      }
    }
  }
  std::vector<int32_t> bounds(stages + 1);
  bounds[stages] = L;
  for (int32_t s = stages, i = L; s >= 1; --s) {
    i = cut[s][i];
    bounds[s - 1] = i;
  }
  return bounds;
}

namespace {
void add(StagePlan& sp, StageOpKind k, int32_t mb, int32_t peer = -1) {
  StageOp op;
  op.kind = k;
  op.micro_batch = mb;
  op.peer_stage = peer;
  sp.ops.push_back(op);
}
void forward(StagePlan& sp, int32_t S, int32_t mb) {
  if (sp.stage > 0) add(sp, StageOpKind::kRecvActivation, mb, sp.stage - 1);
  add(sp, StageOpKind::kForward, mb);
  if (sp.stage < S - 1) add(sp, StageOpKind::kSendActivation, mb, sp.stage + 1);
}
void backward(StagePlan& sp, int32_t S, int32_t mb) {
  if (sp.stage < S - 1) add(sp, StageOpKind::kRecvGradient, mb, sp.stage + 1);
  add(sp, StageOpKind::kBackward, mb);
  sp.last_backward_op = static_cast<int32_t>(sp.ops.size()) - 1;
  if (sp.stage > 0) add(sp, StageOpKind::kSendGradient, mb, sp.stage - 1);
}
}  // namespace

PipelinePlan make_pipeline_plan(const ScheduleRequest& r) {
  TANDEM_REQUIRE(r.micro_batches >= 1, "micro-batches must be >= 1, got {}", r.micro_batches);
  TANDEM_REQUIRE(r.boundaries.size() >= 2, "stage boundaries need at least 2 entries (got {})", r.boundaries.size());
  TANDEM_REQUIRE(r.boundaries.front() == 0, "stage boundaries must start at layer 0, got {}", r.boundaries.front());
  for (size_t i = 1; i < r.boundaries.size(); ++i)
    TANDEM_REQUIRE(r.boundaries[i] > r.boundaries[i - 1], "stage {} is empty: boundaries {} -> {}", i - 1,
                   r.boundaries[i - 1], r.boundaries[i]);
  if (r.data_parallel)
    TANDEM_REQUIRE(r.layer_grad_bytes.size() == static_cast<size_t>(r.boundaries.back()),
                   "gradient sizes given for {} layers but the stages cover {}", r.layer_grad_bytes.size(),
                   r.boundaries.back());
  const int32_t S = static_cast<int32_t>(r.boundaries.size()) - 1;
  const int32_t M = r.micro_batches;
  PipelinePlan plan;
  plan.kind = r.kind;
  plan.stages = S;
  plan.micro_batches = M;
  for (int32_t s = 0; s < S; ++s) {
    StagePlan sp;
    sp.stage = s;
    sp.first_layer = r.boundaries[s];
    sp.end_layer = r.boundaries[s + 1];
    if (r.kind == ScheduleKind::kGPipe) {
      for (int32_t m = 0; m < M; ++m) forward(sp, S, m);
      for (int32_t m = M - 1; m >= 0; --m) backward(sp, S, m);
    } else {
      const int32_t warmup = std::min(S - s - 1, M);
      for (int32_t m = 0; m < warmup; ++m) forward(sp, S, m);
      for (int32_t i = 0; i < M - warmup; ++i) {
        forward(sp, S, warmup + i);
        backward(sp, S, i);
      }
      for (int32_t m = M - warmup; m < M; ++m) backward(sp, S, m);
    }
    if (r.data_parallel) {
      sp.buckets = make_buckets(sp.first_layer, sp.end_layer, r.layer_grad_bytes, r.bucket_bytes, r.bucket_caps);
      for (size_t b = 0; b < sp.buckets.size(); ++b) {
        StageOp op;
        op.kind = StageOpKind::kAllreduceBucket;
        op.bucket = static_cast<int32_t>(b);
        sp.ops.push_back(op);
      }
    }
    add(sp, StageOpKind::kOptimizerStep, -1);
    plan.stage_plans.push_back(std::move(sp));
  }
  return plan;
}

void validate_pipeline_plan(const PipelinePlan& plan) {
  const int32_t S = plan.stages, M = plan.micro_batches;
  TANDEM_CHECK(static_cast<int32_t>(plan.stage_plans.size()) == S, Status::kInternal,
               "pipeline plan has {} stage plans for {} stages", plan.stage_plans.size(), S);
  for (const StagePlan& sp : plan.stage_plans) {
    std::vector<int> fwd(M, 0), bwd(M, 0);
    for (const StageOp& op : sp.ops) {
      if (op.kind == StageOpKind::kForward || op.kind == StageOpKind::kBackward) {
        TANDEM_CHECK(op.micro_batch >= 0 && op.micro_batch < M, Status::kInternal,
                     "stage {}: {} of micro-batch {} out of range [0, {})", sp.stage, stage_op_name(op.kind),
                     op.micro_batch, M);
        if (op.kind == StageOpKind::kForward) {
          ++fwd[op.micro_batch];
        } else {
          TANDEM_CHECK(fwd[op.micro_batch] == 1, Status::kInternal,
                       "stage {}: backward of micro-batch {} before its forward", sp.stage, op.micro_batch);
          ++bwd[op.micro_batch];
        }
      }
      if (op.kind == StageOpKind::kAllreduceBucket)
        TANDEM_CHECK(op.bucket >= 0 && static_cast<size_t>(op.bucket) < sp.buckets.size(), Status::kInternal,
                     "stage {}: all-reduce of bucket {} but the stage has {} buckets", sp.stage, op.bucket,
                     sp.buckets.size());
    }
    for (int32_t m = 0; m < M; ++m)
      TANDEM_CHECK(fwd[m] == 1 && bwd[m] == 1, Status::kInternal,
                   "stage {}: micro-batch {} has {} forwards and {} backwards (expected 1 each)", sp.stage, m, fwd[m],
                   bwd[m]);
    TANDEM_CHECK(!sp.ops.empty() && sp.ops.back().kind == StageOpKind::kOptimizerStep, Status::kInternal,
                 "stage {}: the plan must end with the optimizer step", sp.stage);
  }
  // Unit-time execution: a stage advances while its next op is not a receive without a matching
  // send already executed. Sends are recorded per (from, to, kind) channel in order.
  std::map<std::tuple<int32_t, int32_t, int>, std::vector<int32_t>> sent;  // channel -> micro-batches sent
  std::map<std::tuple<int32_t, int32_t, int>, size_t> received;
  std::vector<size_t> pc(S, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int32_t s = 0; s < S; ++s) {
      const StagePlan& sp = plan.stage_plans[s];
      while (pc[s] < sp.ops.size()) {
        const StageOp& op = sp.ops[pc[s]];
        const bool send = op.kind == StageOpKind::kSendActivation || op.kind == StageOpKind::kSendGradient;
        const bool recv = op.kind == StageOpKind::kRecvActivation || op.kind == StageOpKind::kRecvGradient;
        if (send || recv) {
          const int expect = op.kind == StageOpKind::kSendActivation || op.kind == StageOpKind::kRecvActivation
                                 ? s + 1 - 2 * recv
                                 : s - 1 + 2 * recv;
          TANDEM_CHECK(op.peer_stage == expect && op.peer_stage >= 0 && op.peer_stage < S, Status::kInternal,
                       "stage {}: {} of micro-batch {} names stage {} (expected {})", s, stage_op_name(op.kind),
                       op.micro_batch, op.peer_stage, expect);
        }
        const int kind = op.kind == StageOpKind::kSendActivation || op.kind == StageOpKind::kRecvActivation ? 0 : 1;
        if (send) {
          sent[{s, op.peer_stage, kind}].push_back(op.micro_batch);
        } else if (recv) {
          auto key = std::make_tuple(op.peer_stage, s, kind);
          size_t& k = received[key];
          const auto& v = sent[key];
          if (k >= v.size()) break;  // blocked
          TANDEM_CHECK(v[k] == op.micro_batch, Status::kInternal,
                       "stage {}: {} expects micro-batch {} but stage {} sent micro-batch {} at that position", s,
                       stage_op_name(op.kind), op.micro_batch, op.peer_stage, v[k]);
          ++k;
        }
        ++pc[s];
        progress = true;
      }
    }
  }
  for (int32_t s = 0; s < S; ++s) {
    const auto& ops = plan.stage_plans[s].ops;
    TANDEM_CHECK(pc[s] == ops.size(), Status::kInternal, "pipeline plan deadlocks: stage {} waits forever at op {} ({} "
                 "of micro-batch {})", s, pc[s], stage_op_name(ops[pc[s]].kind), ops[pc[s]].micro_batch);
  }
  for (const auto& [key, v] : sent) {
    auto it = received.find(key);
    size_t got = it == received.end() ? 0 : it->second;
    TANDEM_CHECK(got == v.size(), Status::kInternal, "stage {} sends {} messages to stage {} that are never received",
                 std::get<0>(key), v.size() - got, std::get<1>(key));
  }
}

}  // namespace tandem::engine::parallel
