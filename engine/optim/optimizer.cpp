#include "engine/optim/optimizer.hpp"

#include <cmath>

#include "engine/core/error.hpp"

namespace tandem::engine::optim {

std::string_view optimizer_name(OptimizerKind k) noexcept {
  switch (k) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "unknown";
}

OptimizerKind parse_optimizer(std::string_view s) {
  if (s == "sgd") return OptimizerKind::kSgd;
  if (s == "adam") return OptimizerKind::kAdam;
  if (s == "adamw") return OptimizerKind::kAdamW;
  TANDEM_THROW(Status::kInvalidArgument, "unknown optimizer '{}' (expected sgd, adam or adamw)", s);
}

void OptimizerConfig::validate() const {
  TANDEM_REQUIRE(std::isfinite(lr) && lr >= 0, "optimizer: lr must be a finite number >= 0 (got {})", lr);
  TANDEM_REQUIRE(momentum >= 0 && momentum < 1, "optimizer: momentum must be in [0, 1) (got {})", momentum);
  TANDEM_REQUIRE(dampening >= 0 && dampening <= 1, "optimizer: dampening must be in [0, 1] (got {})", dampening);
  TANDEM_REQUIRE(weight_decay >= 0 && std::isfinite(weight_decay), "optimizer: weight_decay must be >= 0 (got {})",
                 weight_decay);
  TANDEM_REQUIRE(!nesterov || (momentum > 0 && dampening == 0),
                 "optimizer: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})", momentum,
                 dampening);
  TANDEM_REQUIRE(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
                 "optimizer: beta1 and beta2 must be in [0, 1) (got {}, {})", beta1, beta2);
  TANDEM_REQUIRE(eps > 0, "optimizer: eps must be positive (got {})", eps);
}

int state_tensors_per_param(const OptimizerConfig& c) noexcept {
  switch (c.kind) {
    case OptimizerKind::kSgd: return c.momentum > 0 ? 1 : 0;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: return 2;
  }
  return 0;
}

Optimizer::Optimizer(compute::Backend& backend, OptimizerConfig config, std::vector<Tensor> params)
    : backend_(backend), config_(config), params_(std::move(params)) {
  config_.validate();
  const int states = state_tensors_per_param(config_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    TANDEM_REQUIRE(p.defined() && p.is_plain() && p.dtype() == DType::kF32,
                   "optimizer: parameter buffer {} must be a defined plain f32 tensor", i);
    if (p.numel() > 0 && states >= 1) state1_.push_back(backend_.zeros(Shape{p.numel()}));
    else state1_.emplace_back();
    if (p.numel() > 0 && states >= 2) state2_.push_back(backend_.zeros(Shape{p.numel()}));
    else state2_.emplace_back();
  }
}

void Optimizer::step(const std::vector<Tensor>& grads, float lr) {
  TANDEM_REQUIRE(grads.size() == params_.size(), "optimizer: {} gradient buffers for {} parameter buffers",
                 grads.size(), params_.size());
  TANDEM_REQUIRE(std::isfinite(lr) && lr >= 0, "optimizer: learning rate {} must be finite and >= 0", lr);
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (p.numel() == 0) continue;
    TANDEM_REQUIRE(grads[i].numel() == p.numel(), "optimizer: gradient buffer {} has {} elements, parameters {}", i,
                   grads[i].numel(), p.numel());
    Tensor flat = p.view(Shape{p.numel()});
    const Tensor g = grads[i].view(Shape{p.numel()});
    if (config_.kind == OptimizerKind::kSgd) {
      compute::SgdParams s;
      s.lr = lr;
      s.momentum = config_.momentum;
      s.dampening = config_.dampening;
      s.weight_decay = config_.weight_decay;
      s.nesterov = config_.nesterov;
      s.step = steps_;
      backend_.sgd_update(flat, g, state1_[i], s);
    } else {
      compute::AdamParams a;
      a.lr = lr;
      a.beta1 = config_.beta1;
      a.beta2 = config_.beta2;
      a.eps = config_.eps;
      a.weight_decay = config_.weight_decay;
      a.decoupled_weight_decay = config_.kind == OptimizerKind::kAdamW;
      a.step = steps_;
      backend_.adam_update(flat, g, state1_[i], state2_[i], a);
    }
  }
}

std::vector<Tensor> Optimizer::state_tensors() const {
  std::vector<Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (state1_[i].defined()) out.push_back(state1_[i]);
    if (state2_[i].defined()) out.push_back(state2_[i]);
  }
  return out;
}

void Optimizer::restore(int64_t steps, const std::vector<Tensor>& state) {
  TANDEM_REQUIRE(steps >= 0, "optimizer: restored step count {} must be >= 0", steps);
  std::vector<Tensor> mine = state_tensors();
  TANDEM_REQUIRE(state.size() == mine.size(), "optimizer ({}): checkpoint has {} state tensors, this optimizer {}",
                 optimizer_name(config_.kind), state.size(), mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    TANDEM_REQUIRE(state[i].numel() == mine[i].numel(), "optimizer: state tensor {} has {} elements, expected {}", i,
                   state[i].numel(), mine[i].numel());
    Tensor src = state[i].view(mine[i].shape());
    backend_.copy(src, mine[i]);
  }
  steps_ = steps;
}

double clip_grad_norm(compute::Backend& backend, std::vector<Tensor>& grads, double max_norm) {
  TANDEM_REQUIRE(max_norm > 0, "clip_grad_norm: max_norm must be positive (got {})", max_norm);
  double ss = 0;
  for (const Tensor& g : grads) {
    if (g.defined() && g.numel() > 0) ss += backend.sum_squares(g);
  }
  const double norm = std::sqrt(ss);
  if (norm > max_norm) {
    const auto factor = static_cast<float>(max_norm / (norm + 1e-6));
    for (Tensor& g : grads) {
      if (g.defined() && g.numel() > 0) backend.scale(g, factor);
    }
  }
  return norm;
}

}  // namespace tandem::engine::optim
