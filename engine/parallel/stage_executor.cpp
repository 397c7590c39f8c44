#include "engine/parallel/stage_executor.hpp"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::engine::parallel {

namespace {
constexpr size_t kMaxBoundaryTensors = 32;  // tensors crossing one cut (5 tag bits)
constexpr size_t kEvalSendsInFlight = 4;    // bounds memory when evaluation runs ahead
}  // namespace

StageExecutor::StageExecutor(nn::Model& model, int stage, int stages, int32_t first_layer, int32_t end_layer,
                             comm::Communicator* pipe, GradientSync* reducer, Tracer& tracer)
    : model_(model),
      be_(model.backend()),
      stage_(stage),
      stages_(stages),
      first_(first_layer),
      end_(end_layer),
      pipe_(pipe),
      reducer_(reducer),
      tracer_(tracer) {
  const auto L = static_cast<int32_t>(model_.num_layers());
  TANDEM_REQUIRE(stages >= 1 && stage >= 0 && stage < stages, "stage {} of {} stages", stage, stages);
  TANDEM_REQUIRE(first_layer >= 0 && first_layer < end_layer && end_layer <= L,
                 "stage {} covers layers [{}, {}) of a {}-layer model", stage, first_layer, end_layer, L);
  TANDEM_REQUIRE((stage == 0) == (first_layer == 0) && (stage == stages - 1) == (end_layer == L),
                 "stage {} of {} cannot cover layers [{}, {})", stage, stages, first_layer, end_layer);
  TANDEM_REQUIRE(stages == 1 || (pipe != nullptr && pipe->size() == stages && pipe->rank() == stage),
                 "stage {}: the pipeline communicator must have one rank per stage, ranked by stage", stage);
  in_ids_ = model_.spec().crossing(static_cast<size_t>(first_));
  out_ids_ = end_ == L ? std::vector<int32_t>{L - 1} : model_.spec().crossing(static_cast<size_t>(end_));
  TANDEM_REQUIRE(in_ids_.size() <= kMaxBoundaryTensors && out_ids_.size() <= kMaxBoundaryTensors,
                 "stage {}: {} tensors cross a stage boundary; at most {} are supported", stage,
                 std::max(in_ids_.size(), out_ids_.size()), kMaxBoundaryTensors);
}

StageExecutor::~StageExecutor() {
  // Sends still in flight read our buffers: wait for them (bounded by the communicator's deadline).
  for (auto& s : sends_) {
    try {
      if (s.work) s.work->wait();
    } catch (...) {
    }
  }
}

uint32_t StageExecutor::tag(Kind kind, int64_t micro_batch, size_t index) {
  return (static_cast<uint32_t>(kind) << 21) | ((static_cast<uint32_t>(micro_batch) & 0xffffu) << 5) |
         static_cast<uint32_t>(index);
}

Shape StageExecutor::boundary_shape(int32_t producer, int64_t n) const {
  const nn::SampleShape s =
      producer == nn::kModelInput ? model_.spec().input : model_.spec().layers[static_cast<size_t>(producer)].out_shape;
  return s.h * s.w == 1 ? Shape{n, s.c} : Shape{n, s.c, s.h, s.w};
}

std::vector<Tensor> StageExecutor::receive(Kind kind, int from, const std::vector<int32_t>& ids, int64_t n, int64_t mb,
                                           TimeSplit& times) {
  const int64_t t0 = tracer_.now_ns();
  const bool host = be_.device().is_cpu();
  std::vector<Tensor> out(ids.size());
  std::vector<Tensor> bufs(ids.size());
  std::vector<std::unique_ptr<comm::Work>> works;
  for (size_t k = 0; k < ids.size(); ++k) {
    const Shape shape = boundary_shape(ids[k], n);
    if (kind == kGradient && ids[k] == nn::kModelInput) {
      out[k] = be_.zeros(shape);  // nobody computes the data's gradient; backward ignores it
      continue;
    }
    bufs[k] = host ? be_.empty(shape) : Tensor::empty(shape);
    works.push_back(pipe_->recv(bufs[k].data<float>(), static_cast<size_t>(shape.numel()), DType::kF32, from,
                                tag(kind, mb, k)));
  }
  for (auto& w : works) w->wait();
  for (size_t k = 0; k < ids.size(); ++k) {
    if (!bufs[k].defined()) continue;
    if (host) {
      out[k] = bufs[k];
    } else {
      out[k] = be_.empty(bufs[k].shape());
      be_.copy(bufs[k], out[k]);
    }
  }
  const int64_t t1 = tracer_.now_ns();
  times.bubble_ns += t1 - t0;
  tracer_.add(fmt::format("recv {} mb{} from stage {}", kind == kGradient ? "grad" : "act", mb, from), "bubble", t0,
              t1);
  return out;
}

void StageExecutor::send(Kind kind, int to, const std::vector<Tensor>& tensors, const std::vector<int32_t>& ids,
                         int64_t mb, size_t max_in_flight) {
  TANDEM_CHECK(tensors.size() == ids.size(), Status::kInternal, "stage {}: {} tensors to send for {} boundary ids",
               stage_, tensors.size(), ids.size());
  const int64_t t0 = tracer_.now_ns();
  reap_sends(max_in_flight);
  const int64_t n = tensors.empty() ? 0 : tensors[0].dim(0);
  for (size_t k = 0; k < ids.size(); ++k) {
    if (kind == kGradient && ids[k] == nn::kModelInput) continue;
    const Shape shape = boundary_shape(ids[k], tensors[k].defined() ? tensors[k].dim(0) : n);
    Tensor t = tensors[k].defined() ? be_.to_plain(tensors[k]) : be_.zeros(shape);
    if (!be_.device().is_cpu()) t = be_.to_host(t);
    TANDEM_CHECK(t.numel() == shape.numel(), Status::kInternal,
                 "stage {}: tensor {} of the boundary has {} values, expected {} ({})", stage_, ids[k], t.numel(),
                 shape.numel(), shape.str());
    InFlight one;  // one per tensor: sends with different tags may complete in any order
    one.keep.push_back(t);
    one.work = pipe_->send(t.data<float>(), static_cast<size_t>(t.numel()), DType::kF32, to, tag(kind, mb, k));
    sends_.push_back(std::move(one));
  }
  tracer_.add(fmt::format("send {} mb{} to stage {}", kind == kGradient ? "grad" : "act", mb, to), "send", t0,
              tracer_.now_ns());
}

void StageExecutor::reap_sends(size_t keep) {
  // Drop completed sends from the front; then wait until at most `keep` remain.
  size_t i = 0;
  while (i < sends_.size() && sends_[i].work->test()) ++i;
  sends_.erase(sends_.begin(), sends_.begin() + static_cast<std::ptrdiff_t>(i));
  while (sends_.size() > keep) {
    sends_.front().work->wait();
    sends_.erase(sends_.begin());
  }
}

void StageExecutor::drain_sends(TimeSplit& times) {
  if (sends_.empty()) return;
  const int64_t t0 = tracer_.now_ns();
  reap_sends(0);
  const int64_t t1 = tracer_.now_ns();
  times.comm_ns += t1 - t0;
  if (t1 - t0 > 1000) tracer_.add("wait sends", "comm", t0, t1);
}

StageResult StageExecutor::train_step(const PipelinePlan& plan, const std::vector<MicroBatch>& mbs, int64_t normalizer,
                                      const std::function<void()>& optimizer_step, TimeSplit& times) {
  TANDEM_CHECK(plan.stages == stages_ && static_cast<size_t>(stage_) < plan.stage_plans.size(), Status::kInternal,
               "plan for {} stages run by stage {} of {}", plan.stages, stage_, stages_);
  const StagePlan& sp = plan.stage_plans[static_cast<size_t>(stage_)];
  TANDEM_CHECK(sp.first_layer == first_ && sp.end_layer == end_, Status::kInternal,
               "plan gives stage {} layers [{}, {}) but it holds [{}, {})", stage_, sp.first_layer, sp.end_layer,
               first_, end_);
  const auto M = static_cast<size_t>(plan.micro_batches);
  TANDEM_CHECK(mbs.size() == M, Status::kInternal, "plan has {} micro-batches, {} given", M, mbs.size());
  const bool last = stage_ == stages_ - 1;
  std::vector<nn::Activations> acts(M);
  std::vector<std::vector<Tensor>> inputs(M), outputs(M), grads_in(M), grads_out(M);
  std::vector<Tensor> dlogits(M);
  StageResult res;
  bool first_backward = true;
  // Runs f as compute: counted in the split and traced as `name` in `category`.
  const auto computing = [&](std::string name, const char* category, const auto& f) {
    const int64_t t0 = tracer_.now_ns();
    f();
    const int64_t t1 = tracer_.now_ns();
    times.compute_ns += t1 - t0;
    tracer_.add(std::move(name), category, t0, t1);
  };
  for (size_t i = 0; i < sp.ops.size(); ++i) {
    const StageOp& op = sp.ops[i];
    const auto m = static_cast<size_t>(std::max(op.micro_batch, 0));
    switch (op.kind) {
      case StageOpKind::kRecvActivation:
        inputs[m] = receive(kActivation, op.peer_stage, in_ids_, mbs[m].size, op.micro_batch, times);
        break;
      case StageOpKind::kForward:
        computing(fmt::format("forward mb{}", op.micro_batch), "compute", [&] {
          if (stage_ == 0) inputs[m] = {mbs[m].x};
          outputs[m] = model_.forward_range(static_cast<size_t>(first_), static_cast<size_t>(end_), inputs[m],
                                            acts[m], true);
          inputs[m].clear();
          if (!last) return;
          compute::LossOutput lo = be_.softmax_cross_entropy(outputs[m][0], mbs[m].labels, true, normalizer);
          res.loss_sum += lo.loss * static_cast<double>(normalizer);
          res.correct += lo.correct;
          dlogits[m] = std::move(lo.dlogits);
          if (loss_scale_ != 1.0f) be_.scale(dlogits[m], loss_scale_);
          outputs[m].clear();
        });
        break;
      case StageOpKind::kSendActivation:
        send(kActivation, op.peer_stage, outputs[m], out_ids_, op.micro_batch, SIZE_MAX);
        outputs[m].clear();
        break;
      case StageOpKind::kRecvGradient:
        if (before_grad_recv_) before_grad_recv_();
        grads_in[m] = receive(kGradient, op.peer_stage, out_ids_, mbs[m].size, op.micro_batch, times);
        break;
      case StageOpKind::kBackward:
        computing(fmt::format("backward mb{}", op.micro_batch), "compute", [&] {
          if (reducer_ != nullptr) reducer_->arm(static_cast<int32_t>(i) == sp.last_backward_op);
          std::vector<Tensor> g = last ? std::vector<Tensor>{dlogits[m]} : std::move(grads_in[m]);
          dlogits[m] = Tensor();
          grads_out[m] = model_.backward_range(g, acts[m], !first_backward);
          first_backward = false;
        });
        break;
      case StageOpKind::kSendGradient:
        send(kGradient, op.peer_stage, grads_out[m], in_ids_, op.micro_batch, SIZE_MAX);
        grads_out[m].clear();
        break;
      case StageOpKind::kAllreduceBucket:
        if (reducer_ != nullptr) reducer_->issue(op.bucket);  // none: a local step
        break;
      case StageOpKind::kOptimizerStep: {
        if (reducer_ != nullptr) {
          times.comm_ns += reducer_->finish();
          times.allreduce_ns += reducer_->last_allreduce_ns();
        }
        // Sends still in flight are left to finish on their own (each keeps its buffer alive): a rendezvous send
        // completes only when the next stage reaches its receive, and waiting for that here would stall this
        // stage's optimizer step -- and its next forward -- on its neighbour's schedule.
        reap_sends(SIZE_MAX);
        computing("optimizer step", "optimizer", optimizer_step);
        break;
      }
    }
  }
  if (last) {
    for (const MicroBatch& mb : mbs) res.samples += mb.size;
  }
  return res;
}

StageResult StageExecutor::eval_batch(const MicroBatch& mb, int64_t index, TimeSplit& times) {
  StageResult res;
  std::vector<Tensor> in =
      stage_ == 0 ? std::vector<Tensor>{mb.x} : receive(kEvalActivation, stage_ - 1, in_ids_, mb.size, index, times);
  const int64_t t0 = tracer_.now_ns();
  nn::Activations acts;
  std::vector<Tensor> out =
      model_.forward_range(static_cast<size_t>(first_), static_cast<size_t>(end_), in, acts, false);
  in.clear();
  if (stage_ == stages_ - 1) {
    const compute::LossOutput lo = be_.softmax_cross_entropy(out[0], mb.labels, false, 0);
    res.loss_sum = lo.loss * static_cast<double>(mb.size);
    res.correct = lo.correct;
    res.samples = mb.size;
  }
  times.compute_ns += tracer_.now_ns() - t0;
  tracer_.add(fmt::format("eval forward {}", index), "compute", t0, tracer_.now_ns());
  if (stage_ < stages_ - 1) send(kEvalActivation, stage_ + 1, out, out_ids_, index, kEvalSendsInFlight);
  return res;
}

}  // namespace tandem::engine::parallel
